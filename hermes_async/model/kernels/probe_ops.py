"""The layer-op probes: each fast family of the decoder's other ops against float64.

Run in the probe's child process (:mod:`.child`) on the model's shapes with random data:
``onednn-linear`` (vLLM's prepacked oneDNN matmuls, every linear shape of the model, 1-33 rows,
with and without bias; oneDNN's verbose log says which implementation ran, e.g.
``brg_matmul:avx512_core_amx`` on an AMX CPU), ``vllm-fused-ops`` (RMSNorm, residual add +
RMSNorm, neox rotary, SiLU-and-multiply), ``native-gemv`` (our bfloat16 GEMV over packed
weights, 1-8 rows), ``native-moe`` (our grouped GEMV over the experts' stacked weights, both
projections, 0-17 rows per expert), ``native-int8`` (our GEMV over int8 weights, 1-33 rows,
per channel and in groups of 32, and its dequantization), ``native-int4`` (the same over
int4 weights in groups, 1-17 rows), ``native-int4-a8`` / ``native-int8-a8`` (int4 /
int8 weights times int8 activations in blocks of 32, float32 on AVX2, 1-33 rows),
``onednn-w8a8`` (vLLM's oneDNN int8 matmul: int8 weights times per-row int8 activations,
1-100 rows) and ``native-silu`` (our SiLU-and-multiply). Linear shapes with more than
:data:`MAX_PROBE_ELEMENTS` weights are probed with fewer output rows, keeping ``N`` modulo 64
(the kernels' tails).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import tempfile
from collections.abc import Iterator

import torch

from hermes_async.model.kernels.paths import NotApplicable, ProbeReport
from hermes_async.model.kernels.shapes import ProbeShapes
from hermes_async.model.loader import DTYPES

MAX_PROBE_ELEMENTS = 8 << 20
# largest |kernel - float64| relative to the reference's largest magnitude: bfloat16 output
# rounding (2^-9) and float32 accumulation, far below a wrong kernel's error (~1)
RELATIVE_TOLERANCE = {"float32": 1e-4, "bfloat16": 1.6e-2, "float16": 2e-3}
LINEAR_ROWS = (1, 3, 8, 33)
GEMV_ROWS = (1, 2, 5, 8)
MOE_PROBE_EXPERTS = 6  # of the model's experts: enough for empty ones and every row count
MOE_ROW_COUNTS = ((1, 0, 2, 0, 3, 4), (5, 9, 0, 1, 0, 17), (0, 0, 0, 0, 0, 1))
TOKEN_COUNTS = (1, 7, 33)
EPS = 1e-6


class _Worst:
    """Largest error and reference magnitude over the cases."""

    def __init__(self) -> None:
        self.error = 0.0
        self.magnitude = 0.0
        self.cases = 0

    def add(self, out: torch.Tensor, ref: torch.Tensor) -> None:
        self.error = max(self.error, float((out.double() - ref).abs().max()))
        self.magnitude = max(self.magnitude, float(ref.abs().max()))
        self.cases += 1

    def report(self, dtype: str, detail: str) -> ProbeReport:
        tolerance = RELATIVE_TOLERANCE[dtype] * max(self.magnitude, 1e-6)
        return ProbeReport(self.error, tolerance, f"{self.cases} cases; {detail}")


def probe_rows(n: int, k: int) -> int:
    """Output rows to probe of an ``[n, k]`` weight (all of them up to the element cap)."""
    if n * k <= MAX_PROBE_ELEMENTS:
        return n
    return min(n, max(64, MAX_PROBE_ELEMENTS // k // 64 * 64) + n % 64)


def _weight(n: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return (torch.randn(probe_rows(n, k), k, generator=gen) / k ** 0.5).to(dtype)


@contextlib.contextmanager
def _captured_stdout() -> Iterator[list[str]]:
    """What C code prints to fd 1 meanwhile (oneDNN's verbose lines), as a list of lines."""
    libc = ctypes.CDLL(None)
    lines: list[str] = []
    with tempfile.TemporaryFile() as f:
        libc.fflush(None)
        saved = os.dup(1)
        os.dup2(f.fileno(), 1)
        try:
            yield lines
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
            f.seek(0)
            lines.extend(f.read().decode(errors="replace").splitlines())


def onednn_implementations(lines: list[str]) -> list[str]:
    """The matmul implementations in oneDNN verbose lines (``brg_matmul:avx512_core_amx``)."""
    found = []
    for line in lines:
        fields = line.split(",")
        if len(fields) > 6 and fields[0] == "onednn_verbose" and "exec" in fields:
            at = fields.index("exec")
            if len(fields) > at + 3 and fields[at + 2] in ("matmul", "inner_product"):
                found.append(fields[at + 3])
    return list(dict.fromkeys(found))


def _add_with_and_without_bias(worst: _Worst, linear: object, x: torch.Tensor,
                               ref: torch.Tensor, bias: torch.Tensor) -> None:
    """A prepacked linear's cases at ``x``: without and with ``bias`` against ``ref``."""
    worst.add(linear(x, None), ref)  # type: ignore[operator]
    worst.add(linear(x, bias), ref + bias.double())  # type: ignore[operator]


def probe_onednn_linear(shapes: ProbeShapes) -> ProbeReport:
    from hermes_async.model.attention.vllm_cpu import load_ops
    from hermes_async.model.layer_ops import OneDnnLinear

    ops = load_ops()
    dtype = DTYPES[shapes.dtype]
    gen = torch.Generator().manual_seed(7)
    worst = _Worst()
    with _captured_stdout() as lines:
        for n, k in shapes.linears:
            weight = _weight(n, k, dtype, gen)
            linear = OneDnnLinear(ops, weight)
            bias = torch.randn(weight.shape[0], generator=gen).to(dtype)
            for rows in LINEAR_ROWS:
                x = torch.randn(rows, k, generator=gen).to(dtype)
                _add_with_and_without_bias(worst, linear, x, x.double() @ weight.double().T,
                                           bias)
            del linear
    impls = onednn_implementations(lines)
    return worst.report(shapes.dtype, "oneDNN: " + (", ".join(impls) if impls else
                                                   "no verbose log"))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox rotary of each head's first ``2 * cos.shape[-1]`` dimensions; the rest kept."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)


def probe_vllm_fused_ops(shapes: ProbeShapes) -> ProbeReport:
    from hermes_async.model.attention.vllm_cpu import load_ops

    ops = load_ops()
    dtype = DTYPES[shapes.dtype]
    gen = torch.Generator().manual_seed(11)
    h, inter, d = shapes.hidden_size, shapes.intermediate_size, shapes.head_dim
    worst = _Worst()
    weight = (1 + 0.1 * torch.randn(h, generator=gen)).to(dtype)
    max_pos = 4096
    rd = shapes.rotary_dim or d  # partial rotary: the rest of a head passes through
    inv_freq = 1.0 / (shapes.rope_theta ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)
    table = cos_sin.double()
    for t in TOKEN_COUNTS:
        x = torch.randn(t, h, generator=gen).to(dtype)
        out = torch.empty_like(x)
        ops.rms_norm(out, x, weight, EPS)  # type: ignore[attr-defined]
        worst.add(out, _rms_norm(x.double(), weight.double()))
        residual = torch.randn(t, h, generator=gen).to(dtype)
        summed = x.double() + residual.double()
        x2, r2 = x.clone(), residual.clone()
        ops.fused_add_rms_norm(x2, r2, weight, EPS)  # type: ignore[attr-defined]
        worst.add(r2, summed)
        worst.add(x2, _rms_norm(r2.double(), weight.double()))
        positions = torch.randint(0, max_pos, (t,), generator=gen)
        q = torch.randn(t, shapes.num_heads, d, generator=gen).to(dtype)
        k = torch.randn(t, shapes.num_kv_heads, d, generator=gen).to(dtype)
        cos = table[positions, : rd // 2][:, None, :]
        sin = table[positions, rd // 2:][:, None, :]
        q2, k2 = q.reshape(t, -1).clone(), k.reshape(t, -1).clone()
        ops.rotary_embedding(positions, q2, k2, d, cos_sin, True)  # type: ignore[attr-defined]
        worst.add(q2.view_as(q), _rotate(q.double(), cos, sin))
        worst.add(k2.view_as(k), _rotate(k.double(), cos, sin))
        gate_up = torch.randn(t, 2 * inter, generator=gen).to(dtype)
        act = torch.empty(t, inter, dtype=dtype)
        ops.silu_and_mul(act, gate_up)  # type: ignore[attr-defined]
        g = gate_up.double()
        worst.add(act, torch.nn.functional.silu(g[:, :inter]) * g[:, inter:])
        ops.gelu_tanh_and_mul(act, gate_up)  # type: ignore[attr-defined]
        worst.add(act, torch.nn.functional.gelu(g[:, :inter], approximate="tanh") * g[:, inter:])
    return worst.report(shapes.dtype, "rms_norm, fused_add_rms_norm, rotary_embedding, "
                                      "silu_and_mul, gelu_tanh_and_mul")


def probe_native_gemv(shapes: ProbeShapes) -> ProbeReport:
    from hermes_async.model.attention import native

    native.load()
    ops = torch.ops.hermes_native
    if shapes.dtype != "bfloat16":
        raise NotApplicable("the GEMV runs bfloat16 decode steps only")
    if not ops.gemv_supported():
        raise NotApplicable("the GEMV needs AVX512-BF16")
    gen = torch.Generator().manual_seed(13)
    worst = _Worst()
    for n, k in shapes.linears:
        if n % 16 or k % 2:
            continue
        weight = _weight(n, k, torch.bfloat16, gen)
        packed = ops.pack_for_gemv(weight)
        for rows in GEMV_ROWS:
            x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
            out = torch.empty(rows, weight.shape[0], dtype=torch.bfloat16)
            ops.gemv_packed(out, x, packed)
            worst.add(out, x.double() @ weight.double().T)
    if not worst.cases:
        raise NotApplicable("no linear shape the GEMV takes (N % 16, K % 2)")
    return worst.report(shapes.dtype, f"rows {', '.join(map(str, GEMV_ROWS))}")


def probe_native_moe(shapes: ProbeShapes) -> ProbeReport:
    """``grouped_gemv`` (stacked experts) and, in bfloat16 on AVX512-BF16 CPUs,
    ``pack_experts`` + ``grouped_gemv_packed`` on the model's two expert projections
    (``[hidden, 2 * I]`` and ``[I, hidden]`` per expert, a few experts) with rows per expert from
    none to past the kernels' 4- and 8-row passes."""
    from hermes_async.model.attention import native

    native.load()
    ops = torch.ops.hermes_native
    if not shapes.experts:
        raise NotApplicable("no mixture-of-experts layers")
    if shapes.dtype not in ("bfloat16", "float32"):
        raise NotApplicable("the grouped GEMV reads bfloat16 or float32 experts")
    if not ops.grouped_gemv_supported():
        raise NotApplicable("the grouped GEMV needs AVX512F")
    _, _, hidden, inter = shapes.experts
    dtype = DTYPES[shapes.dtype]
    packed_too = dtype == torch.bfloat16 and bool(ops.gemv_supported())
    gen = torch.Generator().manual_seed(19)
    worst = _Worst()
    for k, n in ((hidden, 2 * inter), (inter, hidden)):
        if n % 16:
            raise NotApplicable(f"expert projections of {n} columns (the kernel takes N % 16)")
        w = (torch.randn(MOE_PROBE_EXPERTS, k, n, generator=gen) / k ** 0.5).to(dtype)
        packed = ops.pack_experts(w) if packed_too and k % 2 == 0 else None
        for counts in MOE_ROW_COUNTS:
            rows = sum(counts)
            x = torch.randn(rows, k, generator=gen).to(dtype)
            offsets = torch.tensor(counts).cumsum(0).to(torch.int32)
            ends = offsets.tolist()
            ref = torch.cat([x[a:b].double() @ w[e].double() for e, (a, b) in
                             enumerate(zip([0, *ends[:-1]], ends, strict=True))])
            out = torch.empty(rows, n)
            ops.grouped_gemv(out, x.float(), w, offsets)
            worst.add(out, ref)
            if packed is not None:
                out16 = torch.empty(rows, n, dtype=torch.bfloat16)
                ops.grouped_gemv_packed(out16, x, packed, offsets)
                worst.add(out16, ref)
    what = "stacked and packed" if packed_too else "stacked"
    return worst.report(shapes.dtype, f"{what}, {MOE_PROBE_EXPERTS} experts, rows per expert "
                                      "0-17")


INT8_ROWS = (1, 3, 8, 11, 24, 33)
INT8_GROUPS = (None, 32)
# a GGUF's int8 weights: Q8_0 / Q5_0 and requantized blocks in groups of 32, Q6_K of 16, per
# row where K is no multiple of 32 (gguf.blocks)
GGUF_INT8_GROUPS = (None, 32, 16)
GGUF_INT4_GROUP = 32


def probe_native_int8(shapes: ProbeShapes) -> ProbeReport:
    """``int8_gemv`` on every linear shape (the pairs layout: ``N % 16``, even ``K``) against
    float64 of the same dequantized weight, and ``int8_dequantize`` exactly."""
    from hermes_async.model.attention import native
    from hermes_async.model.quant.weights import PAIRS, quantize_int8

    native.load()
    ops = torch.ops.hermes_native
    if shapes.quantization not in ("int8", "gguf"):
        raise NotApplicable("no int8 weights (model.quantization)")
    groups = GGUF_INT8_GROUPS if shapes.quantization == "gguf" else INT8_GROUPS
    dtype = DTYPES[shapes.dtype]
    if not ops.int8_gemv_supported(dtype):
        raise NotApplicable(f"no int8 GEMV in {shapes.dtype} on this CPU (bfloat16 needs "
                            "AVX512-BF16, float32 AVX2 and FMA)")
    gen = torch.Generator().manual_seed(23)
    worst = _Worst()
    for n, k in shapes.linears:
        if n % 16 or k % 2:
            continue
        weight = _weight(n, k, torch.float32, gen)
        for group in groups:
            if group is not None and k % group:
                continue
            q = quantize_int8(weight, group, PAIRS)
            exact = q.dequantize(torch.float32).double()
            w = torch.empty(q.shape[0], k, dtype=dtype)
            ops.int8_dequantize(w, q.values, q.scales)
            if not torch.equal(w, q.dequantize(dtype)):
                return ProbeReport(float("inf"), 0.0, f"int8_dequantize differs at {n}x{k}")
            for rows in INT8_ROWS:
                x = torch.randn(rows, k, generator=gen).to(dtype)
                out = torch.empty(rows, q.shape[0], dtype=dtype)
                ops.int8_gemv(out, x, q.values, q.scales)
                worst.add(out, x.double() @ exact.T)
    if not worst.cases:
        raise NotApplicable("no linear shape the int8 GEMV takes (N % 16, K % 2)")
    return worst.report(shapes.dtype, f"rows {', '.join(map(str, INT8_ROWS))}, per channel "
                                      f"and groups of {' and '.join(map(str, groups[1:]))}")


INT4_ROWS = (1, 3, 8, 11, 17)


def probe_native_int4(shapes: ProbeShapes) -> ProbeReport:
    """``int4_gemv`` on every linear shape the model's int4 scheme quantizes against float64
    of the same dequantized weight, and ``int4_dequantize`` (to one bfloat16 rounding; float32
    and float16 scales)."""
    from hermes_async.model.attention import native
    from hermes_async.model.quant.apply import INT4_GROUPS
    from hermes_async.model.quant.weights import PAIRS, narrow_scales, quantize_int4

    native.load()
    ops = torch.ops.hermes_native
    if shapes.quantization not in (*INT4_GROUPS, "gguf"):
        raise NotApplicable("no int4 weights (model.quantization)")
    dtype = DTYPES[shapes.dtype]
    if not ops.int4_gemv_supported(dtype):
        raise NotApplicable(f"no int4 GEMV in {shapes.dtype} on this CPU (bfloat16 needs "
                            "AVX512-BF16, float32 AVX2 and FMA)")
    group = INT4_GROUPS.get(shapes.quantization, GGUF_INT4_GROUP)
    gen = torch.Generator().manual_seed(29)
    worst = _Worst()
    for n, k in shapes.linears:
        if n % 16 or k % group:
            continue
        q = quantize_int4(_weight(n, k, torch.float32, gen), group, PAIRS)
        exact = q.dequantize(torch.float32).double()
        w = torch.empty(q.shape[0], k, dtype=dtype)
        ops.int4_dequantize(w, q.values, q.scales, q.mins)
        worst.add(w, exact)
        half = narrow_scales(q)  # float16 scales and mins (int4_a8_gemv's weights)
        if half is not None:
            ops.int4_dequantize(w, half.values, half.scales, half.mins)
            worst.add(w, exact)
        for rows in INT4_ROWS:
            x = torch.randn(rows, k, generator=gen).to(dtype)
            out = torch.empty(rows, q.shape[0], dtype=dtype)
            ops.int4_gemv(out, x, q.values, q.scales, q.mins)
            worst.add(out, x.double() @ exact.T)
    if not worst.cases:
        raise NotApplicable(f"no linear shape the int4 GEMV takes (N % 16, K % {group})")
    return worst.report(shapes.dtype, f"groups of {group}, rows {', '.join(map(str, INT4_ROWS))}")


A8_ROWS = (1, 3, 4, 5, 11, 33)  # passes of 4 rows and their tails


def probe_native_int4_a8(shapes: ProbeShapes) -> ProbeReport:
    """``int4_a8_gemv`` (int4 weights times int8 activations in blocks of 32: float32 or
    bfloat16 in and out, on AVX2; vpdpbusd where AVX512-VNNI is) on every linear shape the
    model's int4 scheme quantizes, against float64 of the same dequantized weight times the
    block-quantized activations (:func:`.quant.a8.dequantize_blocks`, an all-zero block among
    them)."""
    from hermes_async.model.quant.apply import INT4_GROUPS

    if shapes.quantization not in (*INT4_GROUPS, "gguf"):
        raise NotApplicable("no int4 weights (model.quantization)")
    return _probe_a8(shapes, "int4", (INT4_GROUPS.get(shapes.quantization, GGUF_INT4_GROUP),))


def probe_native_int8_a8(shapes: ProbeShapes) -> ProbeReport:
    """``int8_a8_gemv`` (int8 weights times int8 activations in blocks of 32) as
    :func:`probe_native_int4_a8`, per channel and in the scheme's groups (gguf: 32 and 16)."""
    if shapes.quantization not in ("int8", "gguf"):
        raise NotApplicable("no int8 weights (model.quantization)")
    return _probe_a8(shapes, "int8",
                     GGUF_INT8_GROUPS if shapes.quantization == "gguf" else INT8_GROUPS)


def _probe_a8(shapes: ProbeShapes, bits: str, groups: tuple[int | None, ...]) -> ProbeReport:
    from hermes_async.model.attention import native
    from hermes_async.model.quant.a8 import BLOCK, dequantize_blocks
    from hermes_async.model.quant.weights import (
        PAIRS,
        narrow_scales,
        quantize_int4,
        quantize_int8,
    )

    native.load()
    ops = torch.ops.hermes_native
    if shapes.dtype not in ("float32", "bfloat16") or not ops.a8_supported():
        raise NotApplicable(f"int8 activations run on AVX2 CPUs in float32 or bfloat16, not "
                            f"{shapes.dtype} here")
    dtype = getattr(torch, shapes.dtype)  # float32 inputs hold the dtype's values
    gen = torch.Generator().manual_seed(31)
    worst = _Worst()
    differs: list[str] = []  # bfloat16 calls whose output is not float32's rounded
    for n, k in shapes.linears:
        if n % 16 or k % BLOCK:
            continue
        weight = _weight(n, k, torch.float32, gen)
        for group in groups:
            if group is not None and k % group:
                continue
            if bits == "int4":
                q = quantize_int4(weight, group or k, PAIRS)
            else:
                q = quantize_int8(weight, group, PAIRS)
            exact = q.dequantize(torch.float32).double()
            half = narrow_scales(q)  # int4: the scales and mins as float16 too, as run
            operands = [(q.values, q.scales, q.mins) if bits == "int4" else (q.values, q.scales)]
            if bits == "int4" and half is not None:
                operands.append((half.values, half.scales, half.mins))
            gemv = ops.int4_a8_gemv if bits == "int4" else ops.int8_a8_gemv
            for rows in A8_ROWS:
                x = torch.randn(rows, k, generator=gen).to(dtype).float()
                x[0, :BLOCK] = 0.0
                ref = dequantize_blocks(x) @ exact.T
                for tensors in operands:
                    out = torch.empty(rows, q.shape[0])
                    gemv(out, x, *tensors)
                    worst.add(out, ref)
                    if dtype == torch.bfloat16:  # the runner's call: bfloat16 in and out
                        out_bf16 = torch.empty(rows, q.shape[0], dtype=dtype)
                        gemv(out_bf16, x.to(dtype), *tensors)
                        if not torch.equal(out_bf16, out.to(dtype)):
                            differs.append(f"{n}x{k}, {rows} rows")
    if not worst.cases:
        raise NotApplicable(f"no linear shape the {bits} x int8 GEMV takes (N % 16, K % 32)")
    named = ", ".join("per channel" if g is None else f"groups of {g}" for g in groups)
    how = "AVX512-VNNI" if ops.a8_vnni() else "AVX2"
    if bits == "int4":
        how += "; float32 and float16 scales"
    if ops.a8_wide():
        how += ", 512-bit with AVX512-VBMI's vpermb"
    if dtype == torch.bfloat16:
        how += "; bfloat16 in and out: float32's output rounded, bit for bit"
    detail = f"{named}, rows {', '.join(map(str, A8_ROWS))}, {how}"
    if differs:
        return ProbeReport(math.inf, 0.0, f"bfloat16 in and out is not float32's output "
                                          f"rounded ({'; '.join(differs[:3])}); {detail}")
    # float32's tolerance in either dtype: the kernel's arithmetic is float32's
    return worst.report("float32", detail)


W8A8_ROWS = (1, 5, 16, 33, 100)


def probe_onednn_w8a8(shapes: ProbeShapes) -> ProbeReport:
    """vLLM's oneDNN W8A8 matmul (:class:`~hermes_async.model.layer_ops.OneDnnW8A8`: per-row
    int8 activations, prepacked int8 weights) on every linear shape, with and without bias,
    against float64 of the same integers and scales (:func:`~hermes_async.model.quant.w8a8.
    reference`): the integer product is exact, what is left is the scaling's and the output's
    rounding."""
    from hermes_async.model.attention.vllm_cpu import load_ops
    from hermes_async.model.layer_ops import OneDnnW8A8
    from hermes_async.model.quant.w8a8 import quantize_w8a8, reference
    from hermes_async.model.quant.weights import W8A8

    if shapes.quantization != W8A8:
        raise NotApplicable("no W8A8 weights (model.quantization)")
    ops = load_ops()
    dtype = DTYPES[shapes.dtype]
    gen = torch.Generator().manual_seed(29)
    worst = _Worst()
    with _captured_stdout() as lines:
        for n, k in shapes.linears:
            weight = quantize_w8a8(_weight(n, k, torch.float32, gen))
            linear = OneDnnW8A8(ops, weight, dtype)
            bias = torch.randn(weight.shape[0], generator=gen).to(dtype)
            for rows in W8A8_ROWS:
                x = torch.randn(rows, k, generator=gen).to(dtype)
                _add_with_and_without_bias(worst, linear, x, reference(x, weight), bias)
            del linear
    impls = onednn_implementations(lines)
    return worst.report(shapes.dtype, f"rows {', '.join(map(str, W8A8_ROWS))}; oneDNN: "
                        + (", ".join(impls) if impls else "no verbose log"))


def probe_native_silu(shapes: ProbeShapes) -> ProbeReport:
    from hermes_async.model.attention import native

    native.load()
    dtype = DTYPES[shapes.dtype]
    gen = torch.Generator().manual_seed(17)
    inter = shapes.intermediate_size
    worst = _Worst()
    for t in TOKEN_COUNTS:
        gate_up = (3 * torch.randn(t, 2 * inter, generator=gen)).to(dtype)
        out = torch.empty(t, inter, dtype=dtype)
        torch.ops.hermes_native.silu_and_mul(out, gate_up)
        g = gate_up.double()
        worst.add(out, torch.nn.functional.silu(g[:, :inter]) * g[:, inter:])
    return worst.report(shapes.dtype, f"{worst.cases} token counts")
