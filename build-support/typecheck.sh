#!/usr/bin/env bash
# The type checker over verl and its backends (mypy.ini at the repository root says what it checks and why):
# mypy in a virtualenv of its own, reading the libraries of the `cpu` resolve as Pants exports it. Exit 1 on any
# error, so a changed interface (an engine that no longer matches its protocol, a renamed field) fails the build.
set -euo pipefail
cd "$(dirname "$0")/.."
MYPY_VERSION=2.4.1
venv=dist/typecheck-venv
env_python=$(ls dist/export/python/virtualenvs/cpu/*/bin/python 2>/dev/null | head -1 || true)
if [ -z "$env_python" ]; then
  ./pants export --resolve=cpu
  env_python=$(ls dist/export/python/virtualenvs/cpu/*/bin/python | head -1)
fi
if [ ! -x "$venv/bin/mypy" ] || ! "$venv/bin/mypy" --version | grep -q "$MYPY_VERSION"; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "mypy==$MYPY_VERSION"
fi
"$venv/bin/mypy" --config-file mypy.ini --python-executable "$env_python" \
  -p verl -p verl_fsdp -p verl_kernels -p verl_megatron -p verl_rollout
