#!/usr/bin/env bash
# The prepared GPU check (issue 14): the runner's parity suite on CUDA (torch and flashinfer
# backends, CUDA graphs), the runner benchmark on CUDA and a short serving benchmark, then one
# summary table. Run from the repository root; everything lands in $OUT (default ./device_out).
#
#   bash scripts/device_check.sh            # on a CUDA machine: set up, check, summarise
#   bash scripts/device_check.sh prepare    # beforehand, on a machine with PyPI (see below)
#   bash scripts/device_check.sh stage      # on the GPU machine, first call (see below)
#
# Set-up, the first that applies:
#   1. ./.venv exists and its torch sees CUDA: used as it is (a rerun).
#   2. pip reaches its index: `make setup` (its GPU branch: torch>=2.5 and the gpu extra,
#      flashinfer-python), then .venv/bin/python.
#   3. Offline, as on this workplace's lent H200 (nothing outside it can be reached; its
#      python3 has torch with CUDA, transformers, pytest, and nvcc is installed): that python3
#      plus the wheels and the default model's GGUF carried in .device/ (PYTHONPATH, no venv).
#      The carry limit is 64 MiB a call and the GGUF alone is 94 MiB, so it travels in two
#      calls, back to back (the machine stays warm 30 s between them):
#        here:    bash scripts/device_check.sh prepare     # .device/a (wheels + GGUF part 1),
#                                                           # .device/b (GGUF part 2), ignored
#        device:  run "bash scripts/device_check.sh stage"  carry [".device/a"]   (seconds)
#        device:  run "bash scripts/device_check.sh"        carry [".device/b"]   timeout 600
# Each stage runs under `timeout` within BUDGET seconds in all (default 570), so the whole
# script ends inside a 10-minute call; a stage out of time is skipped and says so.
# Knobs: OUT, BUDGET, DTYPE (benchmarks' dtype, default bfloat16: what auto picks on CUDA),
# PY (the python to use), SETUP (auto, venv, make or offline: force one set-up), SKIP (stages
# to leave out, any of: kernels fetch parity bench serving), DEVICE_PY (the device's python
# version for `prepare`, default 3.12).
set -uo pipefail

FLASHINFER_SPEC="flashinfer-python==0.6.6"   # as the gpu extra in pyproject.toml
TVM_FFI_SPEC="apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0"  # flashinfer 0.6.6's own range
# what the lent H200's python3 lacks (its torch, transformers, pytest, aiohttp... stay)
CARRIED_WHEELS=("$FLASHINFER_SPEC" "$TVM_FFI_SPEC" nvidia-ml-py msgspec gguf pytest-asyncio)
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SPLIT_BYTES=48000000  # the GGUF's first part (with the wheels); the rest (50 MB) is part 2
STAGE_DIR=/tmp/hermes-device

prepare() {
  local pip=(python3 -m pip)
  [ -x .venv/bin/python ] && pip=(.venv/bin/python -m pip)
  mkdir -p .git/info
  grep -qxF '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
  rm -rf .device && mkdir -p .device/a/wheels .device/b
  local py="${DEVICE_PY:-3.12}"
  "${pip[@]}" download --quiet --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .device/a/wheels "${CARRIED_WHEELS[@]}" || return 1
  local pybin=python3
  [ -x .venv/bin/python ] && pybin=.venv/bin/python
  local gguf
  gguf=$("$pybin" -c "from pathlib import Path
from hermes_async.model.default_model import hermes_home
from hermes_async.model.gguf_source import find_gguf
print(find_gguf(hermes_home(), progress=False))") || return 1
  head -c "$SPLIT_BYTES" "$gguf" > .device/a/gguf.part-00
  tail -c +"$((SPLIT_BYTES + 1))" "$gguf" > .device/b/gguf.part-01
  du -sh .device/a .device/b
  echo "next: run 'bash scripts/device_check.sh stage' carrying .device/a, then" \
       "'bash scripts/device_check.sh' carrying .device/b"
}

stage() {  # on the device: keep what this call carried for the next call
  mkdir -p "$STAGE_DIR" && cp -r .device/. "$STAGE_DIR"/ && du -sh "$STAGE_DIR"/*
}

case "${1:-run}" in
  prepare) prepare; exit $? ;;
  stage) stage; exit $? ;;
  run) ;;
  *) echo "usage: $0 [run|prepare|stage]" >&2; exit 2 ;;
esac

OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
BUDGET="${BUDGET:-570}"
DTYPE="${DTYPE:-bfloat16}"
START=$(date +%s)
WORK=$(mktemp -d)
ROWS=()
left() { echo $((BUDGET - ($(date +%s) - START))); }

# run_stage KEY NAME CAP LOG CMD...: CMD under timeout (at most CAP s and what the budget
# leaves), output appended to LOG; adds a row to the summary
run_stage() {
  local key=$1 name=$2 cap=$3 log=$4
  shift 4
  local t t0 rc secs result
  if [[ " ${SKIP:-} " == *" $key "* ]]; then
    ROWS+=("| $name | skipped (SKIP) | 0 |")
    return 0
  fi
  t=$(left)
  ((t > cap)) && t=$cap
  if ((t < 20)); then
    ROWS+=("| $name | skipped: out of time | 0 |")
    return 1
  fi
  t0=$(date +%s)
  echo "=== $name (timeout ${t}s) ===" >> "$log"
  timeout --kill-after=10 "$t" "$@" >> "$log" 2>&1
  rc=$?
  secs=$(($(date +%s) - t0))
  if ((rc == 0)); then result=ok
  elif ((rc == 124 || rc == 137)); then result="timed out after ${t}s"
  else result="failed (exit $rc)"; fi
  ROWS+=("| $name | $result | $secs |")
  return $rc
}

find_carried() {  # the carried folder holding $1 (a file or folder name), if any
  local d
  for d in .device/a .device/b "$STAGE_DIR/a" "$STAGE_DIR/b"; do
    [ -e "$d/$1" ] && { echo "$d"; return 0; }
  done
  return 1
}

# --- set-up: a python with CUDA torch, flashinfer and the project's needs -------------------
setup_python() {
  local how=${SETUP:-auto}
  if [ "$how" = auto ]; then
    if [ -x .venv/bin/python ] && .venv/bin/python -c \
        "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
      how=venv
    elif timeout 20 python3 -m pip download --quiet --no-deps -d "$WORK/pip-probe" \
        msgspec >/dev/null 2>&1; then
      how=make
    else
      how=offline
    fi
  fi
  if [ "$how" = venv ]; then
    echo "set-up: the existing .venv"
    PY=.venv/bin/python
  elif [ "$how" = make ]; then
    echo "set-up: make setup (pip reaches its index)"
    timeout 420 make setup || return 1
    PY=.venv/bin/python
  else
    echo "set-up: offline, the machine's python3 and the carried wheels"
    local wheels
    wheels=$(find_carried wheels) || { echo "no carried wheels (.device/a/wheels)"; return 1; }
    "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/hermes-site "$wheels"/wheels/*.whl || return 1
    export PYTHONPATH="/tmp/hermes-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
}

place_gguf() {  # a carried GGUF where `model fetch` looks for a download
  local a b dl
  a=$(find_carried gguf.part-00) && b=$(find_carried gguf.part-01) || return 0
  dl=$("$PY" -c "from hermes_async.model.default_model import hermes_home
print(hermes_home() / 'downloads')") || return 1
  mkdir -p "$dl" && cat "$a/gguf.part-00" "$b/gguf.part-01" > "$dl/$GGUF_NAME" &&
    echo "GGUF reassembled into $dl"
}

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"  # FlashInfer's JIT finds nvcc on PATH or CUDA_HOME
fi
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-6}"
PY=${PY:-python3}
: > "$OUT/setup.log"
setup_python >> "$OUT/setup.log" 2>&1 && place_gguf >> "$OUT/setup.log" 2>&1
SETUP_RC=$?
if ((SETUP_RC == 0)); then SETUP_RESULT=ok; else SETUP_RESULT="failed: see setup.log"; fi
ROWS+=("| set-up | $SETUP_RESULT | $(($(date +%s) - START)) |")
export PY DTYPE OUT
if ! command -v ninja >/dev/null 2>&1; then  # FlashInfer's JIT runs `ninja` from PATH
  NINJA_DIR=$("$PY" -c "import ninja; print(ninja.BIN_DIR)" 2>/dev/null) &&
    export PATH="$NINJA_DIR:$PATH"
fi

ENV_LINE=$("$PY" - 2>&1 <<'EOF'
import importlib.util, subprocess, torch
fi = "not installed"
if importlib.util.find_spec("flashinfer"):
    try:
        import flashinfer
        fi = flashinfer.__version__
    except Exception as e:
        fi = f"does not import ({type(e).__name__}: {e})"
try:
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    nvcc = nvcc.strip().splitlines()[-1]
except (OSError, IndexError):
    nvcc = "no nvcc"
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"{gpu}; torch {torch.__version__} (CUDA {torch.version.cuda}); flashinfer {fi}; {nvcc}")
EOF
)
echo "$ENV_LINE" | tee -a "$OUT/setup.log"
nvidia-smi >> "$OUT/setup.log" 2>&1

# --- FlashInfer's three JIT modules the checks use (float16, float16 with a sliding window,
# bfloat16; head_dim 64), built in parallel in the background while the model converts -------
cat > "$WORK/kernel.py" <<'EOF'
import sys, time, torch
from hermes_async.model.attention.flashinfer_cuda import FlashInferBackend
dtype, window = getattr(torch, sys.argv[1]), None if sys.argv[2] == "none" else int(sys.argv[2])
t0 = time.perf_counter()
FlashInferBackend(32, 9, 3, 64, dtype, torch.device("cuda"), [window])
print(f"kernels {sys.argv[1]} window {sys.argv[2]}: ready in {time.perf_counter() - t0:.0f} s")
EOF
cat > "$WORK/kernels.sh" <<'EOF'
pids=()
for spec in "float16 none" "float16 40" "bfloat16 none"; do
  # shellcheck disable=SC2086
  "$PY" "$(dirname "$0")/kernel.py" $spec &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
EOF
: > "$OUT/kernels.log"
(run_stage kernels "flashinfer kernels (JIT, in parallel)" 300 "$OUT/kernels.log" \
   bash "$WORK/kernels.sh"
 printf '%s\n' "${ROWS[-1]}" > "$WORK/kernels.row") &
KERNELS_PID=$!
run_stage fetch "model fetch (convert)" 240 "$OUT/setup.log" \
  "$PY" -m hermes_async model fetch --quiet
wait "$KERNELS_PID"
ROWS+=("$(cat "$WORK/kernels.row" 2>/dev/null || echo "| flashinfer kernels | no result | |")")

# --- parity on CUDA ---------------------------------------------------------------------------
: > "$OUT/parity.log"
export HERMES_TEST_DEVICE=cuda
run_stage parity "parity suite on CUDA" 240 "$OUT/parity.log" \
  "$PY" -m pytest -q -rfEs -p no:cacheprovider tests/model/test_cuda_backend.py \
  tests/model/test_runner_parity.py tests/model/test_default_model_parity.py \
  tests/model/test_attention_backends.py
PARITY_LINE=$(grep -E '[0-9]+ (passed|failed|error)' "$OUT/parity.log" | tail -1)
unset HERMES_TEST_DEVICE

# --- runner benchmark on CUDA -----------------------------------------------------------------
: > "$OUT/bench_runner.log"
run_stage bench "bench_runner (cuda, $DTYPE)" 120 "$OUT/bench_runner.log" \
  "$PY" loadtest/bench_runner.py --device cuda --dtypes "$DTYPE" --backends torch flashinfer \
  --batches 1 8 32 128 --steps 16 --prompt-len 512 --repeat 3 --json "$OUT/bench_runner.json"

# --- serving benchmark ------------------------------------------------------------------------
cat > "$WORK/wait_server.py" <<'EOF'
import time, urllib.request
for _ in range(240):
    try:
        urllib.request.urlopen("http://127.0.0.1:8000/v1/models", timeout=2)
        break
    except OSError:
        time.sleep(0.5)
else:
    raise SystemExit("the server did not come up in 120 s")
EOF
cat > "$WORK/serve_bench.sh" <<'EOF'
"$PY" -m hermes_async serve --port 8000 --dtype "$DTYPE" &
server=$!
trap 'kill $server 2>/dev/null' EXIT INT TERM
"$PY" "$(dirname "$0")/wait_server.py" || exit 1
"$PY" loadtest/bench_serving.py --workload shared_system --concurrency 1,8,32 \
  --num-requests 64 --max-tokens 64 --label "hermes cuda $DTYPE" --out "$OUT/serving.json"
EOF
: > "$OUT/serving.log"
run_stage serving "bench_serving (shared_system, 1/8/32)" 200 "$OUT/serving.log" \
  bash "$WORK/serve_bench.sh"

# --- summary ----------------------------------------------------------------------------------
{
  echo "# device check $(date -u +%Y-%m-%dT%H:%MZ), $(($(date +%s) - START)) s"
  echo
  echo "$ENV_LINE"
  echo
  echo "| stage | result | seconds |"
  echo "|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "parity: ${PARITY_LINE:-no pytest summary line (see parity.log)}"
  grep -hoE "(attention backend|cuda graphs): .*|kernels (float16|bfloat16) .*" \
    "$OUT/kernels.log" "$OUT/serving.log" 2>/dev/null | sort -u | sed 's/^/- /'
  echo
  echo "## bench_runner"
  grep -E '^\|' "$OUT/bench_runner.log" || echo "(no table: see bench_runner.log)"
  echo
  echo "## bench_serving"
  grep -E '^\|' "$OUT/serving.log" || echo "(no table: see serving.log)"
} > "$OUT/summary.md"
rm -rf "$WORK"
cat "$OUT/summary.md"
