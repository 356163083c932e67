#!/usr/bin/env bash
# Installs the wheels `./pants package ::` built into fresh virtualenvs, as a user would, and checks that
#   1. verl-core alone pulls in none of megatron-core, vllm, sglang, triton, and its `verl` command runs;
#   2. with all five wheels, every backend registers and every recipe validates outside the repository.
# Usage: check_install.sh [DIST_DIR]. Extra pip arguments (an index, find-links) come from pip's own config.
set -euo pipefail
dist="$(cd "${1:-dist}" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
recipes="$here/../recipes"
python="${VERL_TEST_PYTHON:-python3.11}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
constraints="$here/../3rdparty/python/cpu-constraints.txt"  # the CPU torch build, as the lockfile has it

fail() { echo "check_install: $*" >&2; exit 1; }
pip_install() {  # quietly; pip's log is shown only when it fails
    "$work/core/bin/pip" install -q -c "$constraints" "$@" > "$work/pip.log" 2>&1 || { cat "$work/pip.log" >&2; fail "pip install $* failed"; }
}

"$python" -m venv "$work/core"
pip_install "$dist"/verl_core-*.whl
heavy="$("$work/core/bin/python" - "$here" <<'PY'
import importlib.metadata as md, sys
sys.path.insert(0, sys.argv[1])
from check_wheels import HEAVY  # one list of what verl-core must not pull in
print(" ".join(sorted(HEAVY & {d.metadata["Name"].lower() for d in md.distributions()})))
PY
)"
[ -z "$heavy" ] || fail "installing verl-core alone pulled in: $heavy"
(cd "$work" && "$work/core/bin/verl" info) > "$work/info-core.txt" || fail "verl info failed with verl-core alone"
grep -q "fsdp .*not installed (pip install verl-fsdp)" "$work/info-core.txt" || fail "verl info (core only) did not list fsdp as not installed"
echo "check_install: verl-core alone: $("$work/core/bin/pip" list 2>/dev/null | tail -n +3 | wc -l) distributions, none of the heavy backend dependencies"

pip_install "$dist"/verl_*.whl
(cd "$work" && "$work/core/bin/verl" info) > "$work/info-all.txt" || fail "verl info failed with all packages"
for backend in fsdp megatron hf torch; do
    grep -qE "^  $backend .* ready$" "$work/info-all.txt" || fail "backend $backend is not ready after installing all wheels"
done
# Cluster recipes plan here; their missing GPU engines (vllm) are warnings, not errors. Two at a time: each
# `verl validate` spends most of its time importing torch.
validate_one() {
    local log="$work/validate-$(basename "$1").log"
    (cd "$work" && "$work/core/bin/verl" validate "$1" > "$log" 2>&1) || { cat "$log" >&2; echo "check_install: verl validate $(basename "$1") failed" >&2; return 1; }
}
export -f validate_one
export work
printf '%s\0' "$recipes"/*.yaml | xargs -0 -n 1 -P 2 bash -c 'validate_one "$0"' || fail "a recipe did not validate (above)"
echo "check_install: all wheels: backends fsdp, megatron, hf, torch ready; $(ls "$recipes"/*.yaml | wc -l) recipes validate"
