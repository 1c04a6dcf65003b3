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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from hermes_async.model import cpu_features
from hermes_async.model.attention import native
from hermes_async.model.attention.base import (
    AttentionBackend,
    AttentionPlan,
    BackendUnavailable,
    Ordering,
)
from hermes_async.model.attention.vllm_cpu import (
    ONEDNN_LINEAR,
    ONEDNN_W8A8,
    PROBE_OPS,
    SUPPORTED_DTYPES,
    VLLM_FUSED_OPS,
    load_ops,
    step_tensors,
)
from hermes_async.model.attention.vllm_cpu import layer_op_paths as vllm_layer_op_paths
from hermes_async.model.cpu_features import CpuFeatures
from hermes_async.model.kernels.paths import LAYER_OP, KernelPath
from hermes_async.model.layer_ops import (
    TorchLayerOps,
    VllmCpuLayerOps,
    gated,
    prepare_onednn_w8a8,
)
from hermes_async.model.packed import PackedExperts
from hermes_async.model.quant.a8 import BLOCK as A8_BLOCK
from hermes_async.model.quant.weights import PAIRS, W8A8, QuantizedWeight, narrow_scales
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
               v: torch.Tensor, scale: float, window: int | None,
               softcap: float | None = None) -> torch.Tensor:
        k_cache, v_cache = kv
        ops = torch.ops.hermes_native
        ops.write_kv(k.contiguous(), v.contiguous(), k_cache, v_cache, self.slot_mapping)
        q = q.contiguous()
        out = torch.empty_like(q)
        ops.paged_attention(out, q, k_cache, v_cache, self.query_start_loc, self.seq_lens,
                            self.block_table, scale, window or 0)
        return out


GEMV_MAX_ROWS = 8  # the kernel's limit (gemv.h)
# grouped_gemv rereads an expert's weights per 4 rows: past ~4 rows per expert on average
# torch's one-matmul-per-expert wins (128 experts, 2048 x 1536: 0.88x of it at 4, 1.2x at 8)
GROUPED_GEMV_ROWS_PER_EXPERT = 4
# packed copies beside the loaded weights (those without a oneDNN copy to release)
GEMV_MAX_WEIGHT_BYTES = 2 << 30
NATIVE_GEMV = "native-gemv"
NATIVE_SILU = "native-silu"
NATIVE_MOE = "native-moe"
NATIVE_INT8 = "native-int8"
NATIVE_INT4 = "native-int4"
# int4 / int8 weights times int8 activations (model.activations = "int8"; quant/a8.py)
NATIVE_INT4_A8 = "native-int4-a8"
NATIVE_INT8_A8 = "native-int8-a8"
NATIVE_A8 = (NATIVE_INT4_A8, NATIVE_INT8_A8)
# bfloat16 on AVX512-BF16 without AMX (Zen 4, loadtest/bench_quant_kernels.py, BENCHMARKS.md):
# past this many rows a step dequantizes each weight to bfloat16 and multiplies. int8_gemv at
# 2048 x 6144 takes 2.3 ms at 16 rows against the dequantized matmul's 3.6, but 9.9 at 24
# against 3.8 (and 50 at 128: it was allowed 64 rows, and 32 sequences decoded at a third of
# bfloat16's rate); int4_gemv beats its dequantized matmul at every row count up to 128 (10.6
# against 15.3 ms: int4_dequantize is the slow part), but 128 rows changed the default model's
# bfloat16 prefill answers past the test's share (44 of 48 picks against the dequantized
# file's): kept at 16 until a test with a float32 oracle decides which rounding is nearer
INT8_GEMV_MAX_ROWS = 16
INT4_GEMV_MAX_ROWS = 16
# with AMX the bfloat16 matmul of the dequantized weight runs on tiles: past 8 rows it beats
# the GEMVs (a 2048 x 6144 int8 weight at 32 rows: 2.1 ms against int8_gemv's 6.3; BENCHMARKS.md)
AMX_GEMV_MAX_ROWS = 8
# float32 activations (quant_f32.h, AVX2 + FMA): on an AVX2-only Zen 3 the GEMVs beat the
# float32 dequantize + matmul up to 128 rows (2048 x 6144 at 64 rows: int8 22-28 ms, int4
# 25-27, the dequantized matmul 24-32; even at 128; loadtest/bench_quant_kernels.py)
F32_GEMV_MAX_ROWS = 128
# the int8-activation GEMVs (AVX2, float32) beat the float32 dequantize + matmul at every row
# count measured, 1-1024 (2048 x 6144 at 1024 rows: 118-126 ms against the dense float32
# matmul's 188-203; at 128: 15 against 27-30; loadtest/bench_quant_kernels.py): so they take
# every step where they are asked for, prefills too (no row limit), except with AMX, where the
# dequantized weight's bfloat16 matmul runs on tiles: past 64 rows (int8) and 128 (int4) it
# wins (bfloat16, 2048 x 6144 at 512 rows: int8 22.6 ms against int8_a8_gemv's 61.3, int4
# 33.6 against 56.1; at 64 rows int8 5.5 against 5.5, at 128 int4 16.5 against 9.5)
AMX_INT8_A8_MAX_ROWS = 64
AMX_INT4_A8_MAX_ROWS = 128


def quantized_gemv_max_rows(features: CpuFeatures,
                            dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """The most rows ``int8_gemv`` and ``int4_gemv`` take on this CPU kind in ``dtype``
    (measured); more rows dequantize the weight for a matmul."""
    if dtype == torch.float32:
        return F32_GEMV_MAX_ROWS, F32_GEMV_MAX_ROWS
    if features.amx_bf16:
        return AMX_GEMV_MAX_ROWS, AMX_GEMV_MAX_ROWS
    return INT8_GEMV_MAX_ROWS, INT4_GEMV_MAX_ROWS


def a8_gemv_max_rows(features: CpuFeatures,
                     dtype: torch.dtype = torch.bfloat16) -> tuple[float, float]:
    """The most rows ``int8_a8_gemv`` and ``int4_a8_gemv`` take on this CPU kind in ``dtype``
    (measured; unbounded but for bfloat16 with AMX, whose tiles multiply bfloat16 only); more
    rows dequantize the weight for a matmul."""
    if dtype == torch.bfloat16 and features.amx_bf16:
        return AMX_INT8_A8_MAX_ROWS, AMX_INT4_A8_MAX_ROWS
    return math.inf, math.inf


GROUPED_DTYPES = (torch.bfloat16, torch.float32)


def is_released(weight: torch.Tensor) -> bool:
    """Whether ``weight``'s loaded data was released (:meth:`NativeOps.release_float_weights`:
    a broadcast of one element)."""
    return weight.dim() > 0 and all(s == 0 for s in weight.stride())


@dataclass
class GemvWeight:
    """A weight and ``pack_for_gemv``'s copy of it (the weight held so that its ``id()``,
    the key, is never another's)."""

    weight: torch.Tensor
    packed: torch.Tensor


class NativeOps:
    """Mixin for layer ops: our SiLU-and-multiply (``hermes_native::silu_and_mul``, float32
    inside, rounded once to the input's dtype; the ``native-silu`` path) and, for bfloat16
    decode steps of at most ``GEMV_MAX_ROWS`` rows on AVX512-BF16 CPUs, our streaming GEMV over
    a second, packed copy of each weight (``hermes_native::gemv_packed``, the ``native-gemv``
    path: 1.5x oneDNN's matmul at one row here, 1.2x at 8; BENCHMARKS.md); more rows, biases
    and other dtypes take the base class's linear. And the experts' grouped matmuls of decode
    steps (the ``native-moe`` path: only the routed experts read; over :class:`PackedExperts`
    ``grouped_gemv_packed`` at every step size, 2.9-3.0x torch's ``_grouped_mm`` at 1-16 tokens
    of a 128-expert model; over stacked float32 experts ``grouped_gemv`` up to
    ``GROUPED_GEMV_ROWS_PER_EXPERT`` rows per expert on average). Each only where its probe
    admitted it."""

    _gemv: dict[int, GemvWeight]  # by the weight's id()
    _native_silu: bool
    _native_moe: bool
    _native_int8: bool
    _native_int4: bool
    _native_int4_a8: bool
    _native_int8_a8: bool
    _quantized_dtype: torch.dtype  # the activations' dtype int8_gemv / int4_gemv take
    _scratch: torch.Tensor | None  # the dequantized weight of a many-row quantized linear
    int8_gemv_max_rows: int
    int4_gemv_max_rows: int
    int8_a8_max_rows: float
    int4_a8_max_rows: float
    parts: tuple[str, ...]  # TorchLayerOps' (its ``name`` joins them)

    def _use_native(self, dtype: torch.dtype, weights: list[torch.Tensor], *, gemv: bool,
                    silu: bool, moe: bool = False, int8: bool = False,
                    int4: bool = False, int4_a8: bool = False,
                    int8_a8: bool = False) -> None:
        ops = torch.ops.hermes_native
        self._gemv = {}
        self._native_silu = silu
        self._native_moe = moe and ops.grouped_gemv_supported()
        self._native_int8 = int8 and ops.int8_gemv_supported(dtype)
        self._native_int4 = int4 and ops.int4_gemv_supported(dtype)
        a8 = dtype in (torch.float32, torch.bfloat16) and ops.a8_supported()
        self._native_int4_a8 = int4_a8 and self._native_int4 and a8
        self._native_int8_a8 = int8_a8 and self._native_int8 and a8
        self._quantized_dtype = dtype
        features = cpu_features.current()
        self.int8_gemv_max_rows, self.int4_gemv_max_rows = quantized_gemv_max_rows(features,
                                                                                  dtype)
        self.int8_a8_max_rows, self.int4_a8_max_rows = a8_gemv_max_rows(features, dtype)
        self._scratch = None
        if gemv and dtype == torch.bfloat16 and ops.gemv_supported():
            self._gemv = self._pack_for_gemv(weights)
        mine = tuple(n for n, on in ((NATIVE_GEMV, bool(self._gemv)), (NATIVE_SILU, silu),
                                     (NATIVE_MOE, self._native_moe),
                                     (NATIVE_INT8, self._native_int8),
                                     (NATIVE_INT4, self._native_int4),
                                     (NATIVE_INT4_A8, self._native_int4_a8),
                                     (NATIVE_INT8_A8, self._native_int8_a8)) if on)
        self.parts = mine + self.parts

    def _pack_for_gemv(self, weights: list[torch.Tensor]) -> dict[int, GemvWeight]:
        """``gemv_packed``'s copy of each weight it takes (``N % 16 == 0``, even K), by the
        weight's ``id()``: every weight that also has a oneDNN copy (the loaded one is then
        released: :meth:`release_float_weights`, so the packed copy costs no memory), the
        others while their total stays within ``GEMV_MAX_WEIGHT_BYTES`` (each a second copy
        beside the loaded one)."""
        ops = torch.ops.hermes_native
        onednn = getattr(self, "_linears", {})
        budget = GEMV_MAX_WEIGHT_BYTES
        packed: dict[int, GemvWeight] = {}
        for w in weights:
            if w.dim() != 2 or w.shape[0] % 16 or w.shape[1] % 2:
                continue
            size = w.numel() * w.element_size()
            if id(w) not in onednn:
                if size > budget:
                    continue
                budget -= size
            packed[id(w)] = GemvWeight(w, ops.pack_for_gemv(w))
        return packed

    def embedding(self, ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """A tied table released (:meth:`release_float_weights`) is read from the GEMV's
        copy: row ``n`` is lane ``n % 16`` of block ``n // 16``, pair by pair."""
        entry = self._gemv.get(id(table))
        if entry is None or entry.weight is not table or not is_released(table):
            return super().embedding(ids, table)  # type: ignore[misc]
        n, k = table.shape
        pairs = entry.packed.view(torch.bfloat16).view(n // 16, k // 2, 16, 2)
        return pairs[ids // 16, :, ids % 16].reshape(*ids.shape, k)

    def decode_copy(self, weight: torch.Tensor) -> torch.Tensor:
        """The GEMV's packed copy where there is one."""
        entry = self._gemv.get(id(weight))
        if entry is None or entry.weight is not weight:
            return super().decode_copy(weight)  # type: ignore[misc]
        return entry.packed

    def release_float_weights(self) -> int:
        """The weights held both by ``gemv_packed`` (up to ``GEMV_MAX_ROWS`` rows) and by a
        oneDNN handle (more rows, biases) are read only through those copies: their loaded
        data is released (a NaN broadcast of the same shape: one element in memory, and a
        stray read poisons its output)."""
        onednn = getattr(self, "_linears", {})
        released = 0
        for key, entry in self._gemv.items():
            w = entry.weight
            if key not in onednn or is_released(w):
                continue
            released += w.numel() * w.element_size()
            w.data = torch.full((1,), math.nan, dtype=w.dtype).expand(w.shape)
        return released

    def linear(self, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(weight, QuantizedWeight):
            return self.quantized_linear(x, weight, bias)
        entry = self._gemv.get(id(weight)) if bias is None else None
        packed = entry.packed if entry is not None and entry.weight is weight else None
        rows = x.numel() // x.shape[-1] if x.dim() else 0
        if packed is None or not 1 <= rows <= GEMV_MAX_ROWS or x.dtype != torch.bfloat16:
            return super().linear(x, weight, bias)  # type: ignore[misc]
        out = torch.empty(*x.shape[:-1], weight.shape[0], dtype=x.dtype)
        torch.ops.hermes_native.gemv_packed(out.view(rows, -1),
                                            x.reshape(rows, -1).contiguous(), packed)
        return out

    def quantized_linear(self, x: torch.Tensor, weight: QuantizedWeight,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
        """Weights in the pairs layout through ``int8_gemv`` / ``int4_gemv`` (up to
        ``int8_gemv_max_rows`` / ``int4_gemv_max_rows`` rows: :func:`quantized_gemv_max_rows`;
        through ``int4_a8_gemv`` / ``int8_a8_gemv`` where ``native-int4-a8`` /
        ``native-int8-a8`` are admitted and asked for: :mod:`~hermes_async.model.quant.a8`)
        or dequantized by their
        ``*_dequantize`` for a bfloat16 matmul (more rows); anything else the reference."""
        if weight.scheme == W8A8:  # vLLM's oneDNN kernel where prepared (or the reference)
            return super().quantized_linear(x, weight, bias)  # type: ignore[misc]
        int4 = weight.scheme != "int8"
        on = self._native_int4 if int4 else self._native_int8
        if not on or weight.layout != PAIRS or x.dtype != self._quantized_dtype:
            return super().quantized_linear(x, weight, bias)  # type: ignore[misc]
        ops = torch.ops.hermes_native
        n, k = weight.shape
        rows = x.numel() // k
        tensors = ((weight.values, weight.scales, weight.mins) if int4
                   else (weight.values, weight.scales))
        # W4A8 / W8A8 where asked and admitted: K in whole blocks of 32, the group too (int8:
        # or half a block, Q6_K's)
        a8 = (self._native_int4_a8 if int4 else self._native_int8_a8) and k % A8_BLOCK == 0 and (
            weight.group % A8_BLOCK == 0 or (not int4 and weight.group == A8_BLOCK // 2)) and (
            rows <= (self.int4_a8_max_rows if int4 else self.int8_a8_max_rows))
        most = self.int4_gemv_max_rows if int4 else self.int8_gemv_max_rows
        # float16 scales (_narrow_int4_scales) are the a8 kernel's and the dequantizer's only
        if (rows > most or weight.scales.dtype == torch.float16) and not a8:
            w = self._dequantized(n, k, x.dtype)
            (ops.int4_dequantize if int4 else ops.int8_dequantize)(w, *tensors)
            return F.linear(x, w, bias)
        if a8:  # float32 or bfloat16 in and out (float32 sums, rounded once)
            out = torch.empty(*x.shape[:-1], n, dtype=x.dtype)
            gemv = ops.int4_a8_gemv if int4 else ops.int8_a8_gemv
            gemv(out.view(rows, n), x.reshape(rows, k).contiguous(), *tensors)
        else:
            out = torch.empty(*x.shape[:-1], n, dtype=x.dtype)
            gemv = ops.int4_gemv if int4 else ops.int8_gemv
            gemv(out.view(rows, n), x.reshape(rows, k).contiguous(), *tensors)
        return out if bias is None else out + bias

    def _dequantized(self, n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
        """A ``[n, k]`` scratch for a dequantized weight, one buffer reused by every call (the
        forward runs one linear at a time): a fresh one for each would fault in its pages
        every time (past glibc's 32 MiB mmap threshold: 15 ms for 50 MB here)."""
        scratch = self._scratch
        if scratch is None or scratch.numel() < n * k or scratch.dtype != dtype:
            scratch = self._scratch = torch.empty(n * k, dtype=dtype)
        return scratch[:n * k].view(n, k)

    def grouped_mm(self, x: torch.Tensor, weights: torch.Tensor | PackedExperts,
                   offsets: torch.Tensor) -> torch.Tensor:
        if isinstance(weights, PackedExperts):
            if not self._native_moe or x.dtype != torch.bfloat16:
                return super().grouped_mm(x, weights, offsets)  # type: ignore[misc]
            out = torch.empty(x.shape[0], weights.shape[2], dtype=x.dtype)
            torch.ops.hermes_native.grouped_gemv_packed(out, x.contiguous(), weights.packed,
                                                        offsets)
            return out
        groups, _, n = weights.shape
        if (not self._native_moe or x.shape[0] > GROUPED_GEMV_ROWS_PER_EXPERT * groups
                or weights.dtype not in GROUPED_DTYPES or n % 16 or not weights.is_contiguous()):
            return super().grouped_mm(x, weights, offsets)  # type: ignore[misc]
        out = torch.empty(x.shape[0], n, dtype=torch.float32)
        torch.ops.hermes_native.grouped_gemv(out, x.float().contiguous(), weights, offsets)
        return out.to(x.dtype)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not self._native_silu:
            return super().silu_mul(gate_up)  # type: ignore[misc]
        return gated(torch.ops.hermes_native.silu_and_mul, gate_up)


class NativeVllmLayerOps(NativeOps, VllmCpuLayerOps):
    """vLLM's linears (more than a few rows), norms and rotary; our activation and GEMV."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, ops: object,
                 weights: list[torch.Tensor], parts: frozenset[str]) -> None:
        super().__init__(spec, dtype, ops, weights, linears=ONEDNN_LINEAR in parts,
                         fused=VLLM_FUSED_OPS in parts, w8a8=ONEDNN_W8A8 in parts)
        self._use_native(dtype, weights, gemv=NATIVE_GEMV in parts, silu=NATIVE_SILU in parts,
                         moe=NATIVE_MOE in parts, int8=NATIVE_INT8 in parts,
                         int4=NATIVE_INT4 in parts, int4_a8=NATIVE_INT4_A8 in parts,
                         int8_a8=NATIVE_INT8_A8 in parts)


class NativeTorchLayerOps(NativeOps, TorchLayerOps):
    """Plain torch linears (more than a few rows), norms and rotary; our activation and
    GEMV."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, weights: list[torch.Tensor],
                 parts: frozenset[str] = frozenset({NATIVE_GEMV, NATIVE_SILU, NATIVE_MOE,
                                                    NATIVE_INT8, NATIVE_INT4})
                 ) -> None:
        super().__init__(spec)
        self._use_native(dtype, weights, gemv=NATIVE_GEMV in parts, silu=NATIVE_SILU in parts,
                         moe=NATIVE_MOE in parts, int8=NATIVE_INT8 in parts,
                         int4=NATIVE_INT4 in parts, int4_a8=NATIVE_INT4_A8 in parts,
                         int8_a8=NATIVE_INT8_A8 in parts)


class NativeCpuBackend(AttentionBackend):
    """Our kernels, bfloat16 or float32, head sizes and block sizes multiples of 8, any GQA
    grouping, sliding-window layers included (a query sees the keys after its position less
    the window)."""

    name = "native-cpu"
    kv_layout = "hnd"

    def __init__(self, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, sliding_windows: Sequence[int | None]) -> None:
        self.check(block_size, num_heads, num_kv_heads, head_dim, dtype, sliding_windows)
        native.load()
        self.block_size = block_size

    @classmethod
    def check(cls, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
              dtype: torch.dtype, sliding_windows: Sequence[int | None]) -> None:
        if dtype not in SUPPORTED_DTYPES:
            raise BackendUnavailable(f"the native kernels run bfloat16 or float32, not {dtype}")
        if block_size % BLOCK_SIZE_MULTIPLE:
            raise BackendUnavailable(f"the native kernels need blocks of a multiple of "
                                     f"{BLOCK_SIZE_MULTIPLE} tokens, not {block_size}")
        if head_dim % HEAD_DIM_MULTIPLE or num_heads % num_kv_heads:
            raise BackendUnavailable(f"the native kernels need a head size that is a multiple "
                                     f"of {HEAD_DIM_MULTIPLE} (not {head_dim}) and query heads "
                                     f"a multiple of KV heads ({num_heads}, {num_kv_heads})")
        native.check_built()

    @classmethod
    def libraries(cls) -> tuple[Path, ...]:
        return (native.library_path(),)

    @classmethod
    def layer_op_paths(cls) -> list[KernelPath]:
        """Our GEMV, SiLU-and-multiply and experts' grouped GEMV, then vLLM's linears and
        fused ops where its library is installed."""
        library = cls.libraries()
        return [KernelPath(NATIVE_GEMV, LAYER_OP, f"{PROBE_OPS}:probe_native_gemv",
                           libraries=library),
                KernelPath(NATIVE_MOE, LAYER_OP, f"{PROBE_OPS}:probe_native_moe",
                           libraries=library),
                KernelPath(NATIVE_INT8, LAYER_OP, f"{PROBE_OPS}:probe_native_int8",
                           libraries=library),
                KernelPath(NATIVE_INT4, LAYER_OP, f"{PROBE_OPS}:probe_native_int4",
                           libraries=library),
                KernelPath(NATIVE_INT4_A8, LAYER_OP, f"{PROBE_OPS}:probe_native_int4_a8",
                           libraries=library),
                KernelPath(NATIVE_INT8_A8, LAYER_OP, f"{PROBE_OPS}:probe_native_int8_a8",
                           libraries=library),
                KernelPath(NATIVE_SILU, LAYER_OP, f"{PROBE_OPS}:probe_native_silu",
                           libraries=library),
                *vllm_layer_op_paths()]

    def prepare_weights(self, model: torch.nn.Module, dtype: torch.dtype,
                        parts: frozenset[str]) -> str | None:
        """bfloat16 experts re-laid for our grouped GEMV (:class:`PackedExperts`, in place of
        the stacked tensors) where ``native-moe`` is admitted and the CPU has AVX512-BF16:
        every step size then reads each routed expert once as a contiguous stream (decode
        1.2x, a 512-token prefill 1.8x torch's ``_grouped_mm`` on a Zen 4; BENCHMARKS.md);
        W8A8 weights prepacked for vLLM's oneDNN where ``onednn-w8a8`` is admitted."""
        done = []
        if ONEDNN_W8A8 in parts:
            done.append(prepare_onednn_w8a8(load_ops(), model, dtype))
        done.append(self._pack_experts(model, dtype, parts))
        done.append(self._narrow_int4_scales(model, dtype, parts))
        return "; ".join(d for d in done if d) or None

    @staticmethod
    def _narrow_int4_scales(model: torch.nn.Module, dtype: torch.dtype,
                            parts: frozenset[str]) -> str | None:
        """int4 weights that ``int4_a8_gemv`` will read (``native-int4-a8`` admitted and asked
        for: K and the group in blocks of 32) with their scales and mins stored as float16
        where each is a float16 value (:func:`~hermes_async.model.quant.weights.narrow_scales`:
        the same weight): 20 bytes a group of 32 in place of 24, the bytes a one-row decode
        step streams (measured: BENCHMARKS.md). ``int4_dequantize`` reads them too (steps past
        the a8 kernel's rows); ``int4_gemv`` does not, so the weights stay as they are
        without the a8 kernel."""
        ops = torch.ops.hermes_native
        if (not {NATIVE_INT4, NATIVE_INT4_A8} <= parts
                or dtype not in (torch.float32, torch.bfloat16) or not ops.a8_supported()
                or not ops.int4_gemv_supported(dtype)):
            return None
        narrowed, before, after = 0, 0, 0
        table = getattr(model, "quantized_embed", None)  # an untied token table's blocks
        for q in [*model.quantized_weights(), table]:  # type: ignore[operator]
            if (not isinstance(q, QuantizedWeight) or q.layout != PAIRS
                    or q.shape[1] % A8_BLOCK or q.group % A8_BLOCK):
                continue
            half = narrow_scales(q)
            if half is None:  # not int4, already narrowed, or not float16 values
                continue
            narrowed += 1
            before += q.nbytes
            q.scales, q.mins = half.scales, half.mins  # in place: every holder sees it
            after += q.nbytes
        return (f"{narrowed} int4 weights' scales and mins as float16 "
                f"({before / 2**20:.0f} MiB -> {after / 2**20:.0f} MiB)" if narrowed else None)

    @staticmethod
    def _pack_experts(model: torch.nn.Module, dtype: torch.dtype,
                      parts: frozenset[str]) -> str | None:
        ops = torch.ops.hermes_native
        if NATIVE_MOE not in parts or dtype != torch.bfloat16 or not ops.gemv_supported():
            return None
        packed = 0
        for layer in model.layers:  # type: ignore[attr-defined]
            for name in ("experts_gate_up", "experts_down"):
                w = getattr(layer, name)
                if not isinstance(w, torch.Tensor) or w.shape[2] % 16 or w.shape[1] % 2:
                    continue
                experts = PackedExperts(ops.pack_experts(w.data), tuple(w.shape))
                del layer._parameters[name]
                setattr(layer, name, experts)
                packed += 1
        return f"{packed} expert projections packed for the grouped GEMV" if packed else None

    def layer_ops(self, spec: ModelSpec, dtype: torch.dtype, weights: list[torch.Tensor],
                  parts: frozenset[str] | None = None) -> TorchLayerOps:
        """Our activation and small-batch GEMV; vLLM's oneDNN linears and fused kernels where
        that library loads, else torch; each only where admitted (``parts``)."""
        if parts is None:
            parts = frozenset({NATIVE_GEMV, NATIVE_SILU, NATIVE_MOE, NATIVE_INT8,
                               NATIVE_INT4, ONEDNN_LINEAR, VLLM_FUSED_OPS, ONEDNN_W8A8})
        if parts & {ONEDNN_LINEAR, VLLM_FUSED_OPS, ONEDNN_W8A8}:
            try:
                ops = load_ops()
            except (BackendUnavailable, OSError):
                pass
            else:
                return NativeVllmLayerOps(spec, dtype, ops, weights, parts)
        return NativeTorchLayerOps(spec, dtype, weights, parts)

    def plan(self, packed: Sequence[SequenceStep], slot_mapping: torch.Tensor,
             ordering: Ordering) -> NativeCpuPlan:
        return NativeCpuPlan(*step_tensors(packed, self.block_size), slot_mapping)
