#!/usr/bin/env bash
# The GPU check in one command: every GPU test and the GPU benchmarks, within the minutes a GPU machine is lent.
#
#   tests/gpu/run.sh              # on a machine with an NVIDIA GPU (a fresh one is fine), in a copy of the repository
#   tests/gpu/run.sh --dry-run    # on any machine, a CPU one too: installs and runs nothing on a GPU; checks that
#                                 # every GPU test collects and every GPU benchmark takes the arguments given it here
#   tests/gpu/run.sh --only rollout,grpo_step    # rerun sections by id (the ids are in the plans below)
#   tests/gpu/run.sh --help
#
# In order: (1) setup: a virtualenv, dist/gpu-venv (reused when present), from an interpreter that already has
# torch if there is one (its packages stay visible inside, so a GPU image's CUDA torch is used, not downloaded);
# vLLM first (it pins the torch it was built for and brings it), then torch if still missing (PyPI's Linux build
# is the CUDA one), each downloaded before it is installed (so the time limit never stops an install halfway),
# then the project's five packages (editable, with their requirements: megatron-core pinned by verl-megatron as in
# 3rdparty/python/requirements-cpu.txt) and the test tools, under a constraint file that keeps the torch there (with
# vLLM, the transformers and numpy it came with too); then TransformerEngine and flash-attn from prebuilt wheels only
# (never a source build). An optional piece missing or failing is reported, never fatal. Without a package index,
# pip uses --wheels DIR (a folder of wheels) and what the interpreter already has.
# (2) the GPU tests, most valuable first (parity and correctness, then speed), each file under its time limit.
# (3) the GPU benchmarks. Results: benchmarks/results/gpu_<device>.md, rewritten after every section, so a run cut
# short keeps what it finished; raw logs: benchmarks/results/gpu_logs/. Exit status: 0 when every section ran and
# passed, 1 when something failed or was cut by the budget, 2 when there is no GPU (without --dry-run).
#
# Time budget, seconds. The whole run stays within TOTAL_BUDGET_S. A section gets its budget, plus what the sections
# before it left unused (a reused virtualenv leaves most of the setup's), within what is left of the whole; none is
# started with less than MIN_SECTION_S left. (tests/test_gpu_check.py checks that the table and the variables agree.)
#
# | section                                                          | variable          | budget |
# |------------------------------------------------------------------|-------------------|--------|
# | setup: virtualenv, vLLM, torch, the project, test tools          | B_SETUP           |    140 |
# | setup: TransformerEngine, flash-attn (prebuilt wheels only)      | B_SETUP_OPTIONAL  |     20 |
# | test: NCCL weight transfer between pools                         | B_WEIGHT_TRANSFER |     10 |
# | test: rollout contract on vLLM and SGLang                        | B_ROLLOUT         |     60 |
# | test: vLLM on image prompts (Qwen2.5-VL, Qwen3-VL)               | B_VISION          |     30 |
# | test: FSDP padding-free rows through flash-attention             | B_FSDP            |     15 |
# | test: megatron parity on one GPU                                 | B_MEGATRON        |     35 |
# | test: offload between phases                                     | B_OFFLOAD         |     25 |
# | test: memory plan against the allocator's peaks                  | B_MEMORY          |     10 |
# | test: Triton log-prob kernels on the device                      | B_KERNELS         |     15 |
# | test: grpo_tiny_megatron steps on the GPU                        | B_MEGATRON_STEPS  |     20 |
# | bench: GRPO step on Qwen2.5-0.5B shapes                          | B_GRPO            |     60 |
# | bench: fused log-prob kernels at 150k vocabulary                 | B_LOGPROB         |     25 |
# | bench: weight sync between two processes over NCCL               | B_WEIGHT_SYNC     |     15 |
# | total                                                            | TOTAL_BUDGET_S    |    480 |
# shellcheck disable=SC2034  # (the budgets are read through ${!name}: TESTS and BENCHES name them)
set -u

B_SETUP=140
B_SETUP_OPTIONAL=20
B_WEIGHT_TRANSFER=10
B_ROLLOUT=60
B_VISION=30
B_FSDP=15
B_MEGATRON=35
B_OFFLOAD=25
B_MEMORY=10
B_KERNELS=15
B_MEGATRON_STEPS=20
B_GRPO=60
B_LOGPROB=25
B_WEIGHT_SYNC=15
TOTAL_BUDGET_S=480
MIN_SECTION_S=10

# The tests, in the order they run: id|budget variable|what|pytest arguments (paths from the repository root).
TESTS=(
  "weight_transfer|B_WEIGHT_TRANSFER|NCCL weight transfer between pools, bitwise, GB/s; async mode on a vLLM TP=2 replica (3 GPUs; skip on fewer)|tests/gpu/test_weight_transfer_gpu.py tests/gpu/test_async_tp_gpu.py"
  "rollout|B_ROLLOUT|rollout contract on vLLM and SGLang: log-probs against the FSDP actor, weight sync, sleep/wake, LoRA adapters|tests/gpu/test_rollout_gpu.py"
  "vision|B_VISION|vLLM on image prompts (tiny Qwen2.5-VL and Qwen3-VL): log-probs against the FSDP actor, before and after a weight sync|tests/gpu/test_vision_gpu.py"
  "fsdp|B_FSDP|FSDP padding-free rows through flash-attention's varlen kernels (needs flash-attn); tp=2 and cp=2 against one GPU (2 GPUs)|tests/gpu/test_fsdp_gpu.py tests/gpu/test_fsdp_parallel_gpu.py"
  "megatron|B_MEGATRON|megatron parity: log-probs against HF, HF <-> mcore exact, bf16 steps, THD rows with TransformerEngine; TP/PP/CP with 2 GPUs|tests/gpu/test_megatron_gpu.py --deselect tests/gpu/test_megatron_gpu.py::test_grpo_tiny_megatron_steps_on_one_gpu"
  "offload|B_OFFLOAD|offload between phases: device memory given back, the same steps (FSDP, megatron)|tests/gpu/test_offload_gpu.py"
  "memory|B_MEMORY|memory plan: each phase's estimated peak against torch.cuda.max_memory_allocated (FSDP, bf16)|tests/gpu/test_memory_gpu.py"
  "kernels|B_KERNELS|Triton log-prob/entropy kernels and the weight-check fingerprint compiled for the device, against the references|tests/kernels/test_triton.py tests/kernels/test_fingerprint_triton.py"
  "megatron_steps|B_MEGATRON_STEPS|recipes:grpo_tiny_megatron at TP=1 on the GPU: 5 GRPO steps, step time|tests/gpu/test_megatron_gpu.py::test_grpo_tiny_megatron_steps_on_one_gpu"
)
# The benchmarks: id|budget variable|what|command (run with the environment's python; --out is added here).
BENCHES=(
  "grpo_step|B_GRPO|GRPO step, Qwen2.5-0.5B shapes: generation and update tokens/s, MFU, weight sync GB/s, log-prob mismatch, memory per phase|benchmarks/gpu_grpo_step.py"
  "logprob_kernels|B_LOGPROB|fused log-prob kernels against the full-vocabulary path at 150k vocabulary: time and peak memory|benchmarks/logprob_kernels.py --device cuda --repeats 3"
  "weight_sync|B_WEIGHT_SYNC|weight sync between two processes over NCCL (the transfer group): GB/s per bucket size|benchmarks/gpu_weight_sync.py --repeats 3"
)

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
VENV=${VERL_GPU_VENV:-dist/gpu-venv}
DOWNLOADS=$VENV-downloads  # what the big installs download first (kept: a rerun installs from here)
RESULTS_DIR=benchmarks/results
LOGS=$RESULTS_DIR/gpu_logs
ARGS_GIVEN="$*"

usage() {
  sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  cat <<'EOF'

Options:
  --dry-run        check the plan, the tests' collection and the benchmarks' arguments; install and run nothing
  --only IDS       run only these comma-separated section ids (setup runs unless --skip-setup)
  --skip-setup     no virtualenv and no installs: use $VERL_GPU_PYTHON (default python3) as it is
  --reinstall      remove dist/gpu-venv first and set it up again
  --wheels DIR     a folder of wheels pip may install from (for a machine without a package index)
  --no-vllm        do not install vLLM
  --with-sglang    also try SGLang (last, optional: it pins its own torch and may not resolve beside vLLM)
  --budget S       the whole run's budget in seconds (default 480); the section budgets stay as they are
Environment: VERL_GPU_PYTHON (the interpreter), VERL_GPU_VENV (default dist/gpu-venv).
EOF
}

DRY_RUN=0 ONLY="" SKIP_SETUP=0 REINSTALL=0 WHEELS="" WITH_VLLM=1 WITH_SGLANG=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --only) ONLY=${2:?--only needs section ids}; shift ;;
    --skip-setup) SKIP_SETUP=1 ;;
    --reinstall) REINSTALL=1 ;;
    --wheels) WHEELS=${2:?--wheels needs a folder}; shift ;;
    --no-vllm) WITH_VLLM=0 ;;
    --with-sglang) WITH_SGLANG=1 ;;
    --budget) TOTAL_BUDGET_S=${2:?--budget needs seconds}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "tests/gpu/run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$TOTAL_BUDGET_S" in '' | *[!0-9]*) echo "tests/gpu/run.sh: --budget takes whole seconds" >&2; exit 2 ;; esac

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 WANDB_MODE=offline
# The checkout's own sources first, whatever else is installed (tests and benchmarks import them from here).
src_path=""
for d in packages/*/src; do src_path="$src_path$ROOT/$d:"; done
export PYTHONPATH="$src_path$ROOT${PYTHONPATH:+:$PYTHONPATH}"

START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }
say() { printf '[gpu-check %4ss/%ss] %s\n' "$(elapsed)" "$TOTAL_BUDGET_S" "$*"; }
field() { echo "$1" | cut -d'|' -f"$2"; }
selected() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
# LIMIT=min($1, what is left of the whole run's budget); false when less than MIN_SECTION_S is left.
fits() {
  local left=$((TOTAL_BUDGET_S - $(elapsed)))
  [ "$left" -ge "$MIN_SECTION_S" ] || return 1
  LIMIT=$1
  [ "$LIMIT" -le "$left" ] || LIMIT=$left
}
# A section's LIMIT: its budget, or more when the sections before it left time unused (SCHEDULE: the budgets of the
# sections started so far), within what is left of the whole run's.
SCHEDULE=0
start_section() {
  local want
  SCHEDULE=$((SCHEDULE + $1))
  want=$((SCHEDULE - $(elapsed)))
  [ "$want" -ge "$1" ] || want=$1
  fits "$want"
}
# Runs "$@" under a time limit in a process group of its own, output to a log; the group's leftovers (a vLLM engine
# process, NCCL ranks) are killed when it ends. Returns the command's status (124: the limit was reached).
run_limited() {
  local seconds=$1 log=$2
  shift 2
  timeout -k 10 "$seconds" "$@" </dev/null >"$log" 2>&1 &
  local pid=$! rc
  wait "$pid"
  rc=$?
  kill -KILL -- "-$pid" 2>/dev/null
  return "$rc"
}

# ---- the plan ------------------------------------------------------------------------------------------------
budget_sum=0
for v in B_SETUP B_SETUP_OPTIONAL; do budget_sum=$((budget_sum + ${!v})); done
for entry in "${TESTS[@]}" "${BENCHES[@]}"; do v=$(field "$entry" 2); budget_sum=$((budget_sum + ${!v})); done

print_plan() {
  local entry v n=0
  echo "GPU check plan (budget ${TOTAL_BUDGET_S} s in all; the sections' budgets add up to ${budget_sum} s):"
  echo "  setup (${B_SETUP} s): virtualenv $VENV$([ "$SKIP_SETUP" = 1 ] && echo ' (skipped: --skip-setup)')"
  echo "    pip install --upgrade pip             (when a package index answers)"
  [ "$WITH_VLLM" = 1 ] && echo "    pip download vllm; pip install vllm   (first: it brings the torch it pins; optional)"
  echo "    pip download torch; pip install torch (if none imports yet: PyPI's Linux build is the CUDA one)"
  echo "    constraints: the installed torch, torchvision, torchaudio, triton (with vLLM: transformers, numpy) kept"
  echo "    pip install -c constraints -e packages/verl-core -e packages/verl-kernels -e packages/verl-fsdp \\"
  echo "        -e packages/verl-rollout -e packages/verl-megatron   (with requirements: megatron-core, ray, tensordict, ...)"
  echo "    pip install -c constraints pytest hypothesis peft"
  echo "  setup, optional (${B_SETUP_OPTIONAL} s), prebuilt wheels only:"
  echo "    pip install --only-binary :all: 'transformer_engine[pytorch]'"
  echo "    pip install --only-binary :all: flash-attn"
  [ "$WITH_SGLANG" = 1 ] && echo "    pip install sglang"
  [ -n "$WHEELS" ] && echo "  (pip also installs from $WHEELS)"
  for entry in "${TESTS[@]}"; do
    n=$((n + 1)); v=$(field "$entry" 2)
    selected "$(field "$entry" 1)" || continue
    printf '  test %s. %-16s %4s s  %s\n      python -m pytest %s\n' "$n" "$(field "$entry" 1)" "${!v}" "$(field "$entry" 3)" "$(field "$entry" 4)"
  done
  for entry in "${BENCHES[@]}"; do
    n=$((n + 1)); v=$(field "$entry" 2)
    selected "$(field "$entry" 1)" || continue
    printf '  bench %s. %-15s %4s s  %s\n      python %s --out %s/%s.md\n' "$n" "$(field "$entry" 1)" "${!v}" \
      "$(field "$entry" 3)" "$(field "$entry" 4)" "$LOGS" "$(field "$entry" 1)"
  done
  echo "  results: $RESULTS_DIR/gpu_<device>.md, raw logs in $LOGS/"
}

# ---- --dry-run: the plan, the tests' collection, the benchmarks' arguments -----------------------------------
if [ "$DRY_RUN" = 1 ]; then
  PY=${VERL_GPU_PYTHON:-python3}
  print_plan
  failed=0
  if [ "$budget_sum" -gt "$TOTAL_BUDGET_S" ]; then
    echo "dry run: the sections' budgets ($budget_sum s) exceed the total ($TOTAL_BUDGET_S s)"; failed=1
  fi
  # Every path the plan names exists; then one collection of tests/gpu (every file imports), and one of the plan's
  # other files and node ids (a renamed test is not found). The Triton file goes first in that one: on a CPU it must
  # set TRITON_INTERPRET before triton is first imported. (pytest ignores a node id of a file it collects anyway.)
  files=() ids=()
  for entry in "${TESTS[@]}"; do
    for a in $(field "$entry" 4); do
      case "$a" in --*) continue ;; esac
      [ -e "${a%%::*}" ] || { echo "dry run: $a: no such file"; failed=1; continue; }
      case "$a" in
        *::*) [[ " ${ids[*]} " == *" $a "* ]] || ids+=("$a") ;;
        tests/gpu/*) ;;
        *) [[ " ${files[*]} " == *" $a "* ]] || files+=("$a") ;;
      esac
    done
  done
  for group in 1 2; do
    if [ "$group" = 1 ]; then args=(tests/gpu); else args=("${files[@]}" "${ids[@]}"); fi
    [ "${#args[@]}" -gt 0 ] || continue
    out=$("$PY" -m pytest --collect-only -q "${args[@]}" 2>&1)
    rc=$?
    echo "  collect ${args[*]}: $(echo "$out" | tail -n 1)"
    if [ "$rc" -ne 0 ]; then
      echo "$out" | tail -n 40
      echo "dry run: collecting ${args[*]} failed (pytest exit $rc; interpreter $PY: VERL_GPU_PYTHON names one with the" \
        "project's dependencies, e.g. dist/export/python/virtualenvs/cpu/*/bin/python after ./pants export --resolve=cpu)"
      failed=1
    fi
  done
  for entry in "${BENCHES[@]}"; do
    id=$(field "$entry" 1)
    read -r -a cmd <<<"$(field "$entry" 4)"
    if ! out=$("$PY" "${cmd[@]}" --out "$LOGS/$id.md" --dry-run 2>&1); then
      echo "$out"; echo "dry run: benchmark $id does not take its arguments: ${cmd[*]} --out $LOGS/$id.md"; failed=1
    else
      while IFS= read -r line; do echo "  $line"; done <<<"$out"
    fi
  done
  if [ "$failed" = 0 ]; then echo "dry run: OK ($(elapsed) s)"; else echo "dry run: FAILED"; fi
  exit "$failed"
fi

# ---- a GPU, or nothing to do -----------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "tests/gpu/run.sh: no NVIDIA GPU here (nvidia-smi is not on the PATH). This is the GPU check: run it on a" \
    "machine with one, or check it here with tests/gpu/run.sh --dry-run." >&2
  exit 2
fi
GPU_NAMES=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)
if [ -z "$GPU_NAMES" ]; then
  echo "tests/gpu/run.sh: nvidia-smi lists no GPU (driver not loaded?). Check the plan with tests/gpu/run.sh --dry-run." >&2
  exit 2
fi
DEVICE=$(echo "$GPU_NAMES" | head -n 1)
GPU_COUNT=$(echo "$GPU_NAMES" | wc -l | tr -d ' ')
SLUG=$(echo "$DEVICE" | tr '[:upper:]' '[:lower:]' | sed -e 's/[^a-z0-9]\{1,\}/_/g' -e 's/^_//' -e 's/_$//' -e 's/^nvidia_//')
# A run of some sections (--only) writes a results file of its own, beside the whole run's.
TAG=${ONLY:+_only_${ONLY//,/_}}
RESULTS=$RESULTS_DIR/gpu_${SLUG:-gpu}${TAG}.md
ROWS=$LOGS/run${TAG}
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
MEMORY=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader 2>/dev/null | head -n 1)
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
[ -n "$ONLY" ] || rm -rf "$LOGS"
mkdir -p "$LOGS"
rm -f "$ROWS".*
FAILURES=0
PY_LINE="(not set up yet)"

write_results() {  # the whole results file from the rows so far (rewritten after each section)
  {
    echo "# GPU check: $DEVICE"
    echo
    echo "Run $(date -u +%Y-%m-%dT%H:%M:%SZ) with \`tests/gpu/run.sh $ARGS_GIVEN\` (commit $COMMIT): $(elapsed) s of the" \
      "${TOTAL_BUDGET_S} s budget used so far."
    echo
    echo "- Machine: ${GPU_COUNT} x $DEVICE ($MEMORY), driver $DRIVER; $(getconf _NPROCESSORS_ONLN) CPU cores; $PY_LINE"
    echo "- Raw logs: \`$LOGS/\` (one per step, named below)"
    for part in setup tests bench; do
      [ -s "$ROWS.$part.rows" ] || continue
      echo
      case "$part" in
        setup) echo "## Setup"; echo; echo "| step | result | seconds | log |"; echo "|---|---|---|---|" ;;
        tests) echo "## Tests"; echo; echo "| # | section | result | seconds / limit | log |"; echo "|---|---|---|---|---|" ;;
        bench) echo "## Benchmarks"; echo; echo "| section | result | seconds / limit | log |"; echo "|---|---|---|---|" ;;
      esac
      cat "$ROWS.$part.rows"
      [ -s "$ROWS.$part.details" ] && { echo; cat "$ROWS.$part.details"; }
    done
    for entry in "${BENCHES[@]}"; do
      selected "$(field "$entry" 1)" || continue
      f=$LOGS/$(field "$entry" 1).md
      [ -s "$f" ] && { echo; sed 's/^# /## /' "$f"; }
    done
  } >"$RESULTS.tmp"
  mv -f "$RESULTS.tmp" "$RESULTS"
}

# ---- 1. setup --------------------------------------------------------------------------------------------------
setup_row() { echo "| $1 | $2 | $3 | $4 |" >>"$ROWS.setup.rows"; }
setup_deadline=0
setup_limit() {  # a setup step's LIMIT: its own cap, the setup section's remainder and the run's
  local cap=$1 left=$((setup_deadline - $(date +%s)))
  [ "$left" -ge "$cap" ] || cap=$left
  [ "$cap" -ge 5 ] && fits "$cap"
}
# pip_step NAME REQUIRED(1/0) CAP pip-arguments...: one pip install, timed and reported. With STAGED=1 the packages
# are first downloaded under the step's cap (a download cut short harms nothing), then installed from what came down,
# under what is left of the whole run's budget: a big install (vLLM and its torch) killed halfway would leave a
# half-written torch in the virtualenv. An install cut all the same marks the virtualenv to be made again next run.
pip_step() {
  local name=$1 required=$2 cap=$3 limit log t0 rc result
  shift 3
  log=$LOGS/setup_${name}.log
  if ! setup_limit "$cap"; then
    setup_row "$name" "not run: the setup budget was spent" 0 ""
    [ "$required" = 1 ] && FAILURES=$((FAILURES + 1))
    return 1
  fi
  limit=$LIMIT
  t0=$(date +%s)
  rc=0
  if [ "${STAGED:-0}" = 1 ]; then
    say "setup: $name (download limit ${limit} s): pip download $*"
    run_limited "$limit" "$log" "$VPY" -m pip download --dest "$DOWNLOADS" "${PIP_EXTRA[@]}" "$@"
    rc=$?
    if [ "$rc" = 0 ] && fits 600; then
      limit=$LIMIT
      say "setup: $name (install limit ${limit} s): pip install $*"
      run_limited "$limit" "$log.install" "$VPY" -m pip install --find-links "$DOWNLOADS" "${PIP_EXTRA[@]}" "$@"
      rc=$?
      cat "$log.install" >>"$log" && rm -f "$log.install"
    fi
  else
    say "setup: $name (limit ${limit} s): pip install $*"
    run_limited "$limit" "$log" "$VPY" -m pip install "${PIP_EXTRA[@]}" "$@"
    rc=$?
  fi
  # Cut while it was writing packages (not while resolving or downloading): the virtualenv cannot be trusted.
  if { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && grep -q '^Installing collected packages' "$log" &&
    ! grep -q '^Successfully installed' "$log"; then
    touch "$VENV/.gpu-check-broken"
  fi
  case "$rc" in
    0) result="ok" ;;
    124 | 137) result="cut at ${limit} s" ;;
    *) result="failed (pip exit $rc): $(grep -E '^ERROR' "$log" | head -n 1 | cut -c1-200 | tr '|' '/')" ;;
  esac
  [ "$rc" -ne 0 ] && [ "$required" = 0 ] && result="$result; optional, going on"
  [ "$rc" -ne 0 ] && [ "$required" = 1 ] && FAILURES=$((FAILURES + 1))
  setup_row "$name" "$result" "$(($(date +%s) - t0))" "\`$(basename "$log")\`"
  say "setup: $name: $result"
  write_results
  return "$rc"
}
py_has() { "$VPY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }
version_of() { "$VPY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null; }

pick_python() {  # an interpreter that already has torch (a GPU image's), else the newest of 3.12, 3.11, python3
  local py
  if [ -n "${VERL_GPU_PYTHON:-}" ]; then echo "$VERL_GPU_PYTHON"; return; fi
  for py in python3 python3.12 python3.11; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' 2>/dev/null && { echo "$py"; return; }
  done
  for py in python3.12 python3.11 python3; do command -v "$py" >/dev/null 2>&1 && { echo "$py"; return; }; done
  echo python3
}

probe_index() {  # without a reachable package index, pip installs only from --wheels (and fails fast otherwise)
  [ -n "$WHEELS" ] && PIP_EXTRA+=(--find-links "$WHEELS")
  if ! timeout 20 "$VPY" -m pip index versions pip --retries 0 --timeout 8 >/dev/null 2>&1; then
    export PIP_NO_INDEX=1
    setup_row "package index" "not reachable: pip installs only from ${WHEELS:-the wheels given with --wheels (none given)}" 0 ""
    say "setup: no package index reachable: pip installs from ${WHEELS:-nothing but what is there}"
  fi
}

run_setup() {
  local base t0 site constraints nbi req missing reqs
  start_section "$B_SETUP" || return
  setup_deadline=$(($(date +%s) + LIMIT))
  base=$(pick_python)
  if [ -f "$VENV/.gpu-check-broken" ]; then
    say "setup: $VENV: an install was cut short in it last time: making it again"
    REINSTALL=1
  fi
  if [ "$REINSTALL" = 1 ] && [ -d "$VENV" ]; then rm -rf "$VENV"; fi
  if [ -f "$VENV/.gpu-check-setup" ]; then  # a setup that finished earlier: its report, not a second setup
    sed 's/^| \([^|]*\) |/| \1 (earlier run) |/' "$VENV/.gpu-check-setup" >>"$ROWS.setup.rows"
    VPY=$VENV/bin/python
    say "setup: reusing $VENV (set up earlier; --reinstall starts over)"
    REUSED=1
    return
  fi
  t0=$(date +%s)
  if [ ! -x "$VENV/bin/python" ]; then
    say "setup: virtualenv $VENV from $base ($("$base" --version 2>&1))"
    "$base" -m venv "$VENV" >"$LOGS/setup_venv.log" 2>&1 || "$base" -m venv --without-pip "$VENV" >>"$LOGS/setup_venv.log" 2>&1
  fi
  VPY=$VENV/bin/python
  if [ ! -x "$VPY" ]; then
    setup_row venv "failed: $base -m venv (see the log)" "$(($(date +%s) - t0))" "\`setup_venv.log\`"
    FAILURES=$((FAILURES + 1))
    VPY=$base
    return
  fi
  # When the base interpreter has torch (a GPU image's), its packages stay visible after the virtualenv's own: that
  # torch is reused, not downloaded again. (A pip without pip in the virtualenv: the base's, through the same path.)
  local layered="no"
  if "$base" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' 2>/dev/null ||
    ! "$VPY" -m pip --version >/dev/null 2>&1; then
    site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$base" -c 'import site; print("\n".join(p for p in site.getsitepackages() if p.endswith("-packages")))' \
      >"$site/gpu_check_base.pth" 2>/dev/null && layered="yes"
  fi
  "$VPY" -m pip --version >/dev/null 2>&1 || "$VPY" -m ensurepip >>"$LOGS/setup_venv.log" 2>&1
  setup_row venv "ok: $("$VPY" --version 2>&1) from $base; the base's packages visible inside: $layered" \
    "$(($(date +%s) - t0))" "\`setup_venv.log\`"
  probe_index
  [ -n "${PIP_NO_INDEX:-}" ] || pip_step pip 0 20 --upgrade pip  # a current pip resolves from metadata alone
  # Editable installs build with the setuptools already there when it can (no download of a build environment):
  # one that builds editable wheels by itself (>= 70.1, or >= 64 beside the wheel package).
  nbi=()
  "$VPY" - 2>/dev/null <<'PY' && nbi=(--no-build-isolation)
import importlib.util, sys, setuptools
v = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
sys.exit(not (v >= (70, 1) or (v >= (64, 0) and importlib.util.find_spec("wheel"))))
PY

  if [ "$WITH_VLLM" = 0 ]; then
    setup_row vllm "not installed (--no-vllm)" 0 ""
  elif py_has vllm; then
    setup_row vllm "present: $(version_of vllm)" 0 ""
  else
    STAGED=1 pip_step vllm 0 110 vllm
  fi
  if "$VPY" -c 'import torch' >/dev/null 2>&1; then
    setup_row torch "present: $(version_of torch)" 0 ""
  else
    STAGED=1 pip_step torch 1 100 torch
  fi
  constraints=$VENV/gpu-check-constraints.txt
  # The torch there stays; with vLLM, what else it pins stays too (a newer transformers or numpy would break it).
  "$VPY" - >"$constraints" 2>/dev/null <<'PY'
import importlib.metadata as m
names = ["torch", "torchvision", "torchaudio", "triton"]
try:
    m.version("vllm")
    names += ["transformers", "numpy"]
except m.PackageNotFoundError:
    pass
for name in names:
    try:
        print(f"{name}=={m.version(name)}")
    except m.PackageNotFoundError:
        pass
PY
  setup_row constraints "$(tr '\n' ' ' <"$constraints")" 0 "\`$constraints\`"
  if ! pip_step project 1 60 -c "$constraints" "${nbi[@]}" -e packages/verl-core -e packages/verl-kernels \
    -e packages/verl-fsdp -e packages/verl-rollout -e packages/verl-megatron; then
    # One missing requirement (no index, a wheel not given) fails the whole install: each requirement alone then,
    # and the packages without their requirements (the sources are on PYTHONPATH anyway).
    reqs=$("$VPY" - <<'PY'
import glob, re
reqs = set()
for path in glob.glob("packages/*/pyproject.toml"):
    block = re.search(r"^dependencies = \[(.*?)^\]", open(path).read(), re.S | re.M)
    reqs.update(r for r in re.findall(r'"([^"]+)"', block.group(1) if block else "") if not r.startswith("verl-"))
print("\n".join(sorted(reqs)))
PY
)
    missing=""
    while IFS= read -r req; do
      [ -n "$req" ] || continue
      setup_limit 30 || break
      timeout "$LIMIT" "$VPY" -m pip install "${PIP_EXTRA[@]}" -c "$constraints" "$req" >>"$LOGS/setup_project_each.log" 2>&1 ||
        missing="$missing $req"
    done <<<"$reqs"
    timeout 60 "$VPY" -m pip install --no-deps "${nbi[@]}" -e packages/verl-core -e packages/verl-kernels \
      -e packages/verl-fsdp -e packages/verl-rollout -e packages/verl-megatron >>"$LOGS/setup_project_each.log" 2>&1
    if [ -z "$missing" ]; then
      FAILURES=$((FAILURES - 1))  # (every requirement installed one at a time: the project step is made good)
      setup_row "project, one requirement at a time" "ok: every requirement installed" 0 "\`setup_project_each.log\`"
    else
      setup_row "project, one requirement at a time" "missing:$missing" 0 "\`setup_project_each.log\`"
    fi
  fi
  pip_step test_tools 1 40 -c "$constraints" pytest hypothesis peft
  # Whatever was cut short: torch must still import, with CUDA, or nothing below means anything.
  PY_LINE=$("$VPY" -c 'import platform, torch; print(f"Python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}, available: {torch.cuda.is_available()})")' 2>&1 | tail -n 1)
  if ! "$VPY" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' >/dev/null 2>&1; then
    setup_row "torch sees the GPU" "**no**: $PY_LINE" 0 ""
    FAILURES=$((FAILURES + 1))
    say "setup: torch does not see a GPU here: $PY_LINE (--reinstall starts over)"
    return
  fi
  setup_row "torch sees the GPU" "yes: $PY_LINE" 0 ""
  [ "$FAILURES" = 0 ] && SETUP_OK=1  # (the next run reuses this setup: the stamp is written after the optional steps)
}

run_optional_setup() {
  start_section "$B_SETUP_OPTIONAL" || return
  setup_deadline=$(($(date +%s) + LIMIT))
  local constraints=$VENV/gpu-check-constraints.txt
  if py_has transformer_engine; then
    setup_row transformer_engine "present: $(version_of transformer_engine)" 0 ""
  else
    pip_step transformer_engine 0 15 -c "$constraints" --only-binary :all: "transformer_engine[pytorch]"
  fi
  if py_has flash_attn; then
    setup_row flash_attn "present: $(version_of flash_attn)" 0 ""
  else
    pip_step flash_attn 0 15 -c "$constraints" --only-binary :all: flash-attn
  fi
  if [ "$WITH_SGLANG" = 1 ] && ! py_has sglang; then
    setup_deadline=$(($(date +%s) + 60))
    pip_step sglang 0 60 -c "$constraints" sglang
  fi
}

PIP_EXTRA=() REUSED=0 SETUP_OK=0 VPY=${VERL_GPU_PYTHON:-python3}
if [ "$SKIP_SETUP" = 1 ]; then
  setup_row "setup" "skipped (--skip-setup): $VPY as it is" 0 ""
else
  say "setup (budget ${B_SETUP} s)"
  run_setup
  [ "$FAILURES" = 0 ] || say "setup: $FAILURES required step(s) failed: going on with what is there"
  if [ "$REUSED" = 0 ]; then
    run_optional_setup
    [ "$SETUP_OK" = 1 ] && cp "$ROWS.setup.rows" "$VENV/.gpu-check-setup"
  fi
fi
PY_LINE=$("$VPY" -c 'import platform, torch; print(f"Python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})")' 2>/dev/null | tail -n 1)
PY_LINE="${PY_LINE:-torch does not import}; $("$VPY" - 2>/dev/null <<'PY' | tail -n 1
import importlib
found = []
for name in ("vllm", "sglang", "transformer_engine", "flash_attn", "megatron.core", "triton"):
    try:
        found.append(f"{name} {getattr(importlib.import_module(name), '__version__', '?')}")
    except Exception:
        found.append(f"{name} absent")
print(", ".join(found))
PY
)"
write_results

# ---- 2. tests --------------------------------------------------------------------------------------------------
n=0
for entry in "${TESTS[@]}"; do
  n=$((n + 1))
  id=$(field "$entry" 1) v=$(field "$entry" 2) what=$(field "$entry" 3)
  selected "$id" || continue
  read -r -a targets <<<"$(field "$entry" 4)"
  log=$LOGS/test_${id}.log
  if ! start_section "${!v}"; then
    echo "| $n | $what | not run: the time budget was spent | 0 / ${!v} | |" >>"$ROWS.tests.rows"
    FAILURES=$((FAILURES + 1)); write_results; continue
  fi
  limit=$LIMIT
  say "test $n/${#TESTS[@]} $id (limit ${limit} s): ${targets[*]}"
  t0=$(date +%s)
  VERL_GPU_RESULTS=$LOGS/test_${id}.json run_limited "$limit" "$log" \
    "$VPY" -m pytest -q -rfEs -o "faulthandler_timeout=$((limit > 20 ? limit - 10 : limit))" "${targets[@]}"
  rc=$?
  counts=$(grep -E '^=*[ ]*[0-9]+ (passed|failed|skipped|error|errors|deselected|xfailed|xpassed)' "$log" | tail -n 1 |
    sed -e 's/=//g' -e 's/^ *//' -e 's/ *$//')
  case "$rc" in
    0) if [[ "$counts" == *passed* ]]; then result="ok: $counts"; else result="all skipped: $counts"; fi ;;
    1) result="**FAILED**: $counts" ;;
    5) result="no tests collected" ;;
    124 | 137) result="**cut at ${limit} s** (faulthandler's stacks in the log)${counts:+: $counts}" ;;
    *) result="**error** (pytest exit $rc)${counts:+: $counts}" ;;
  esac
  [ "$rc" -eq 0 ] || FAILURES=$((FAILURES + 1))
  echo "| $n | $what | $result | $(($(date +%s) - t0)) / ${limit} | \`$(basename "$log")\` |" >>"$ROWS.tests.rows"
  summary=$(grep -E '^(FAILED|ERROR|SKIPPED) ' "$log" | head -n 12)
  if [ -n "$summary" ] || [ -s "$LOGS/test_${id}.json" ]; then
    {
      echo "$id:"
      echo
      echo '```'
      [ -n "$summary" ] && echo "$summary" | cut -c1-300
      [ -s "$LOGS/test_${id}.json" ] && tr -d '\n' <"$LOGS/test_${id}.json" | tr -s ' ' && echo
      echo '```'
      echo
    } >>"$ROWS.tests.details"
  fi
  say "test $id: $result"
  write_results
done

# ---- 3. benchmarks ---------------------------------------------------------------------------------------------
for entry in "${BENCHES[@]}"; do
  id=$(field "$entry" 1) v=$(field "$entry" 2) what=$(field "$entry" 3)
  selected "$id" || continue
  read -r -a cmd <<<"$(field "$entry" 4)"
  log=$LOGS/bench_${id}.log
  rm -f "$LOGS/$id.md" "$LOGS/$id.json"
  if ! start_section "${!v}"; then
    echo "| $what | not run: the time budget was spent | 0 / ${!v} | |" >>"$ROWS.bench.rows"
    FAILURES=$((FAILURES + 1)); write_results; continue
  fi
  limit=$LIMIT
  say "bench $id (limit ${limit} s): ${cmd[*]}"
  t0=$(date +%s)
  run_limited "$limit" "$log" "$VPY" "${cmd[@]}" --out "$LOGS/$id.md"
  rc=$?
  case "$rc" in
    0) result="done (below)" ;;
    124 | 137) result="**cut at ${limit} s**" ;;
    *) result="**failed** (exit $rc): $(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-200 | tr '|' '/')" ;;
  esac
  [ "$rc" -eq 0 ] || FAILURES=$((FAILURES + 1))
  echo "| $what | $result | $(($(date +%s) - t0)) / ${limit} | \`$(basename "$log")\` |" >>"$ROWS.bench.rows"
  say "bench $id: $result"
  write_results
done

write_results
if [ "$FAILURES" = 0 ]; then
  say "done: every section ran and passed. Results: $RESULTS"
  exit 0
fi
say "done: $FAILURES section(s) failed or were cut. Results: $RESULTS (raw logs in $LOGS/)"
exit 1
