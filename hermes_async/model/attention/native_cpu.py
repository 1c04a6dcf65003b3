"""Our own CPU backend (``native-cpu``): the C++ kernels of :mod:`.native`, K/V read in place.

Same pool layout (``hnd``) and step tensors as ``vllm-cpu`` (:func:`.vllm_cpu.step_tensors`):
one ``write_kv`` and one ``paged_attention`` call per layer cover the whole mixed step. The
kernels are built at set-up (``make setup``, or ``python -m hermes_async.model.attention.native``)
for this CPU and torch; a backend made before that refuses with :class:`BackendUnavailable`.
The decoder's SiLU-and-multiply is ours too (``silu_and_mul``: 3-5x faster than vLLM's on a
Zen 4, BENCHMARKS.md), and so are the linears of bfloat16 decode steps of up to 8 rows
(``gemv_packed``, streaming a packed copy of each weight); its other ops are vLLM's fused
CPU ones (:class:`VllmCpuLayerOps`: oneDNN linears over prepacked weights, norms, rotary)
where the ``vllm-cpu`` library loads, plain torch elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hermes_async.model.attention import native
from hermes_async.model.attention.base import (
    AttentionBackend,
    AttentionPlan,
    BackendUnavailable,
    Ordering,
)
from hermes_async.model.attention.vllm_cpu import SUPPORTED_DTYPES, load_ops, step_tensors
from hermes_async.model.layer_ops import TorchLayerOps, VllmCpuLayerOps
from hermes_async.model.spec import ModelSpec
from hermes_async.step import SequenceStep

BLOCK_SIZE_MULTIPLE = 8  # the kernel's vector width
HEAD_DIM_MULTIPLE = 8


@dataclass
class NativeCpuPlan(AttentionPlan):
    """One step's kernel inputs (int32 on the CPU, as :func:`step_tensors` makes them) and
    the new tokens' slots."""

    query_start_loc: torch.Tensor  # [B + 1]
    seq_lens: torch.Tensor  # [B]: context length including the new tokens
    block_table: torch.Tensor  # [B, max_blocks]
    slot_mapping: torch.Tensor  # [T] int64

    def attend(self, kv: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, scale: float, window: int | None) -> torch.Tensor:
        if window is not None:
            raise ValueError("the native-cpu backend does not apply sliding windows")
        k_cache, v_cache = kv
        ops = torch.ops.hermes_native
        ops.write_kv(k.contiguous(), v.contiguous(), k_cache, v_cache, self.slot_mapping)
        q = q.contiguous()
        out = torch.empty_like(q)
        ops.paged_attention(out, q, k_cache, v_cache, self.query_start_loc, self.seq_lens,
                            self.block_table, scale)
        return out


GEMV_MAX_ROWS = 8  # the kernel's limit (gemv.h)
GEMV_MAX_WEIGHT_BYTES = 2 << 30  # the packed copies double the weights' memory: small models


class NativeOps:
    """Mixin for layer ops: our SiLU-and-multiply (``hermes_native::silu_and_mul``, float32
    inside, rounded once to the input's dtype) and, for bfloat16 decode steps of at most
    ``GEMV_MAX_ROWS`` rows on AVX512-BF16 CPUs, our streaming GEMV over a second, packed copy
    of each weight (``hermes_native::gemv_packed``: 1.5x oneDNN's matmul at one row here,
    1.2x at 8; BENCHMARKS.md); more rows, biases and other dtypes take the base class's
    linear."""

    _gemv: dict[int, torch.Tensor]

    def _pack_for_gemv(self, dtype: torch.dtype, weights: list[torch.Tensor]) -> None:
        ops = torch.ops.hermes_native
        self._gemv = {}
        total = sum(w.numel() * w.element_size() for w in weights)
        if dtype != torch.bfloat16 or not ops.gemv_supported() or total > GEMV_MAX_WEIGHT_BYTES:
            return
        self._gemv = {w.data_ptr(): ops.pack_for_gemv(w) for w in weights
                      if w.dim() == 2 and w.shape[0] % 16 == 0 and w.shape[1] % 2 == 0}

    def linear(self, x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        packed = self._gemv.get(weight.data_ptr()) if bias is None else None
        rows = x.numel() // x.shape[-1] if x.dim() else 0
        if packed is None or not 1 <= rows <= GEMV_MAX_ROWS or x.dtype != torch.bfloat16:
            return super().linear(x, weight, bias)  # type: ignore[misc]
        out = torch.empty(*x.shape[:-1], weight.shape[0], dtype=x.dtype)
        torch.ops.hermes_native.gemv_packed(out.view(rows, -1),
                                            x.reshape(rows, -1).contiguous(), packed)
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        out = torch.empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2, dtype=gate_up.dtype,
                          device=gate_up.device)
        torch.ops.hermes_native.silu_and_mul(out, gate_up.contiguous())
        return out


class NativeVllmLayerOps(NativeOps, VllmCpuLayerOps):
    """vLLM's linears (more than a few rows), norms and rotary; our activation and GEMV."""

    name = "native-cpu+vllm-cpu"

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, ops: object,
                 weights: list[torch.Tensor]) -> None:
        super().__init__(spec, dtype, ops, weights)
        self._pack_for_gemv(dtype, weights)


class NativeTorchLayerOps(NativeOps, TorchLayerOps):
    """Plain torch linears (more than a few rows), norms and rotary; our activation and
    GEMV."""

    name = "native-cpu+torch"

    def __init__(self, spec: ModelSpec, dtype: torch.dtype,
                 weights: list[torch.Tensor]) -> None:
        super().__init__(spec)
        self._pack_for_gemv(dtype, weights)


class NativeCpuBackend(AttentionBackend):
    """Our kernels for models without sliding windows, bfloat16 or float32, head sizes and
    block sizes multiples of 8, any GQA grouping."""

    name = "native-cpu"
    kv_layout = "hnd"

    def __init__(self, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, sliding_windows: Sequence[int | None]) -> None:
        if dtype not in SUPPORTED_DTYPES:
            raise BackendUnavailable(f"the native kernels run bfloat16 or float32, not {dtype}")
        if any(w is not None for w in sliding_windows):
            raise BackendUnavailable("the model has sliding-window layers")
        if block_size % BLOCK_SIZE_MULTIPLE:
            raise BackendUnavailable(f"the native kernels need blocks of a multiple of "
                                     f"{BLOCK_SIZE_MULTIPLE} tokens, not {block_size}")
        if head_dim % HEAD_DIM_MULTIPLE or num_heads % num_kv_heads:
            raise BackendUnavailable(f"the native kernels need a head size that is a multiple "
                                     f"of {HEAD_DIM_MULTIPLE} (not {head_dim}) and query heads "
                                     f"a multiple of KV heads ({num_heads}, {num_kv_heads})")
        native.load()
        self.block_size = block_size

    def layer_ops(self, spec: ModelSpec, dtype: torch.dtype,
                  weights: list[torch.Tensor]) -> TorchLayerOps:
        """Our activation and small-batch GEMV; vLLM's oneDNN linears and fused kernels where
        that library loads, else torch."""
        try:
            ops = load_ops()
        except (BackendUnavailable, OSError):
            return NativeTorchLayerOps(spec, dtype, weights)
        return NativeVllmLayerOps(spec, dtype, ops, weights)

    def plan(self, packed: Sequence[SequenceStep], slot_mapping: torch.Tensor,
             ordering: Ordering) -> NativeCpuPlan:
        return NativeCpuPlan(*step_tensors(packed, self.block_size), slot_mapping)
