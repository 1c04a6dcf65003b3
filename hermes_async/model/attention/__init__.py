"""Attention backends over the paged KV pool; see :mod:`.base` for the seam.

:func:`select_backend` picks one at start-up (``model.attention_backend``): ``auto`` takes the
fastest that can run here, by measurement (:func:`auto_order`; BENCHMARKS.md, "Our own C++
kernel against vLLM's"): on a CPU in bfloat16 with AVX512-BF16 and no AMX ``native-cpu`` (our
own kernels, built at set-up: :mod:`.native_cpu`), then ``vllm-cpu``; on other CPUs and in
float32 ``vllm-cpu``; ``flashinfer`` on CUDA when flashinfer imports and builds its kernels for
the model; else ``torch``; and says why. A named backend that cannot run raises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hermes_async.model.attention.base import (
    AttentionBackend,
    AttentionPlan,
    BackendUnavailable,
    KVLayout,
    Ordering,
)
from hermes_async.model.attention.reference import TorchBackend
from hermes_async.model.spec import ModelSpec

BACKENDS = ("auto", "torch", "vllm-cpu", "native-cpu", "flashinfer")

__all__ = ["BACKENDS", "AttentionBackend", "AttentionPlan", "BackendChoice", "BackendUnavailable",
           "KVLayout", "Ordering", "TorchBackend", "auto_order", "select_backend"]


@dataclass(frozen=True)
class BackendChoice:
    backend: AttentionBackend
    reason: str  # for the start-up log line
    block_size: int  # the KV block size the backend runs with


def backend_block_size(name: str, block_size: int, configured: bool) -> int:
    """A derived block size rounded up to what the backend's kernels need; a configured one
    is kept (the backend then refuses it if it must)."""
    if name != "vllm-cpu" or configured:
        return block_size
    from hermes_async.model.attention.vllm_cpu import BLOCK_SIZE_MULTIPLE

    return -(-block_size // BLOCK_SIZE_MULTIPLE) * BLOCK_SIZE_MULTIPLE


def _make(name: str, spec: ModelSpec, block_size: int, dtype: torch.dtype,
          device: torch.device) -> AttentionBackend:
    if name == "torch":
        # cascade attention applies no sliding-window mask
        return TorchBackend(block_size, device,
                            use_cascade=all(w is None for w in spec.sliding_windows))
    if name == "vllm-cpu":
        if device.type != "cpu":
            raise BackendUnavailable("vllm-cpu runs on the CPU only")
        from hermes_async.model.attention.vllm_cpu import VllmCpuBackend

        return VllmCpuBackend(block_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                              dtype, spec.sliding_windows)
    if name == "native-cpu":
        if device.type != "cpu":
            raise BackendUnavailable("native-cpu runs on the CPU only")
        from hermes_async.model.attention.native_cpu import NativeCpuBackend

        return NativeCpuBackend(block_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                                dtype, spec.sliding_windows)
    if name == "flashinfer":  # imports flashinfer itself, on CUDA only
        from hermes_async.model.attention.flashinfer_cuda import FlashInferBackend

        return FlashInferBackend(block_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                                 dtype, device, spec.sliding_windows)
    raise ValueError(f"unknown attention backend {name!r}; one of {', '.join(BACKENDS)}")


def select_backend(name: str, spec: ModelSpec, block_size: int, dtype: torch.dtype,
                   device: torch.device, *, block_size_configured: bool = True) -> BackendChoice:
    """The backend ``name`` (``auto``: the fastest available) for this model and device.

    ``block_size_configured`` False: ``block_size`` was derived, and may be rounded up to what
    the chosen backend needs (the returned :attr:`BackendChoice.block_size`)."""
    if name != "auto":
        bs = backend_block_size(name, block_size, block_size_configured)
        return BackendChoice(_make(name, spec, bs, dtype, device), f"{name} (configured)", bs)
    skipped = []
    for candidate in auto_order(device, dtype):
        bs = backend_block_size(candidate, block_size, block_size_configured)
        try:
            backend = _make(candidate, spec, bs, dtype, device)
        except (BackendUnavailable, ImportError, OSError) as e:
            skipped.append(f"{candidate} unavailable: {e}")
            continue
        reason = f"{candidate} (auto: {'; '.join(skipped)})" if skipped else f"{candidate} (auto)"
        return BackendChoice(backend, reason, bs)
    why = "; ".join(skipped) or f"no faster backend on {device.type}"
    return BackendChoice(_make("torch", spec, block_size, dtype, device), f"torch (auto: {why})",
                         block_size)


def auto_order(device: torch.device, dtype: torch.dtype) -> list[str]:
    """The backends ``auto`` tries, fastest first as measured (then ``torch``): ``native-cpu``
    leads only where it measured faster than ``vllm-cpu`` on decode and prefill, bfloat16 on a
    CPU with AVX512-BF16 and without AMX (vLLM's AMX code path was not measured); vLLM's
    kernels measured faster in float32."""
    if device.type == "cuda":
        return ["flashinfer"]
    if device.type != "cpu":
        return []
    if (dtype == torch.bfloat16 and torch.cpu._is_avx512_bf16_supported()
            and not torch.cpu._is_amx_tile_supported()):
        return ["native-cpu", "vllm-cpu"]
    return ["vllm-cpu"]
