"""A quantized linear weight and its reference arithmetic.

``int8``: symmetric, one float32 scale per output row and group of ``group`` inputs along K
(``group == K``: per output channel): ``w ~ q * scale``, ``q = round(w / scale)`` in
``[-127, 127]``, ``scale = max|w| / 127`` over the group.

``int4``: asymmetric in groups of ``group`` inputs (32 or 128): ``w ~ q * scale + min``,
``q`` in ``[0, 15]``, ``min`` and ``scale = (max - min) / 15`` over the group (GGUF's
Q4_1 / Q4_K form; Q4_0's ``(q - 8) * d`` is ``scale = d``, ``min = -8 d``). The scales and
mins are float16 values (held in float32: :func:`narrow_scales` stores them as float16 for
the kernels that read them so, 20 bytes a group of 32 in place of 24) wherever float16 holds
the whole weight's in its normal range; else float32's.

The integers are kept in one of two layouts, chosen by the kernel that will read them:

- ``pairs``: our ``int8_gemv``'s and ``int4_gemv``'s (``hermes_native``): int8
  ``[N / 16, K / 2, 16, 2]`` (the bfloat16 GEMV's pair layout, a byte per weight) or int4
  ``[N / 16, K / 2, 16]`` uint8 (each byte the pair, low nibble first), scales (and mins)
  ``[N / 16, K / group, 16]``; needs ``N % 16 == 0`` and an even group.
- ``rows``: ``[N, K]`` int8 (int4: uint8, one value a byte) and scales (mins)
  ``[N, K / group]``: the plain reference's.

:meth:`QuantizedWeight.dequantize` is the reference for every kernel: ``q * scale (+ min)``
computed in float32, then rounded to the activations' dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

INT8_MAX = 127
W8A8 = "w8a8"  # int8 weights as "int8", the activations quantized too (.w8a8)
INT4_MAX = 15
PAIRS = "pairs"
ROWS = "rows"
LAYOUTS = (PAIRS, ROWS)


@dataclass
class QuantizedWeight:
    """An ``[N, K]`` weight as integers and scales (see the module's docstring)."""

    scheme: str  # "int8", "int4" or W8A8 (int8 integers)
    layout: str  # PAIRS or ROWS
    shape: tuple[int, int]  # (N, K)
    group: int  # inputs per scale along K (K: per output channel)
    values: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None = None  # int4
    kernel: object | None = None  # a kernel's own prepared copy (a backend's prepare_weights)
    # W8A8 smoothing (.smooth): [K] float32 the activations are multiplied by before their
    # quantization; the integers hold the weight times its inverse, column by column
    input_scale: torch.Tensor | None = None

    @property
    def fits_pairs(self) -> bool:
        """Whether the pairs layout holds this weight (``N % 16 == 0``, even K and group)."""
        return not (self.shape[0] % 16 or self.shape[1] % 2 or self.group % 2)

    @property
    def nbytes(self) -> int:
        """Bytes held: integers, scales and mins."""
        return sum(t.numel() * t.element_size() for t in (self.values, self.scales, self.mins)
                   if t is not None)

    def rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(q [N, K], scales [N, K / group], mins [N, K / group] or None)`` whatever the
        layout (q int8, or uint8 0-15 for int4)."""
        n, k = self.shape
        if self.layout == ROWS:
            return self.values, self.scales, self.mins
        if self.scheme == "int4":
            pairs = torch.stack((self.values & 15, self.values >> 4), dim=-1)
        else:
            pairs = self.values
        q = pairs.permute(0, 2, 1, 3).reshape(n, k)

        def unpack(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.permute(0, 2, 1).reshape(n, k // self.group)

        return q, unpack(self.scales), unpack(self.mins)  # type: ignore[return-value]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight ``[N, K]`` as ``q * scale (+ min)`` (float32; times ``input_scale``
        column by column where smoothed), rounded to ``dtype``."""
        return self._values(*self.rows(), dtype)

    def dequantize_rows(self, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``index`` (``[R]`` int64) of :meth:`dequantize`'s weight, ``[R, K]``, the
        others left alone: an embedding lookup in a quantized table."""
        n, k = self.shape
        if self.layout == ROWS:
            mins = None if self.mins is None else self.mins[index]
            return self._values(self.values[index], self.scales[index], mins, dtype)
        block, lane = index // 16, index % 16  # pairs: 16 rows interleaved per block
        v = self.values[block, :, lane]  # [R, K / 2] (int4 bytes) or [R, K / 2, 2]
        if self.scheme == "int4":
            v = torch.stack((v & 15, v >> 4), dim=-1)
        mins = None if self.mins is None else self.mins[block, :, lane]
        return self._values(v.reshape(-1, k), self.scales[block, :, lane], mins, dtype)

    def _values(self, q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None,
                dtype: torch.dtype) -> torch.Tensor:
        w = q.float() * scales.float().repeat_interleave(self.group, dim=1)
        if mins is not None:
            w = w + mins.float().repeat_interleave(self.group, dim=1)
        if self.input_scale is not None:
            w = w * self.input_scale
        return w.to(dtype)


def _check(weight: torch.Tensor, group: int, layout: str, scheme: str) -> None:
    """Refuse what ``scheme`` cannot quantize into ``layout`` (ValueError, with the reason)."""
    if weight.dim() != 2:
        raise ValueError(f"{scheme} quantizes 2-D weights, not {tuple(weight.shape)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    n, k = weight.shape
    if k % group:
        raise ValueError(f"K = {k} is not a multiple of the group {group}")
    if layout == PAIRS and (n % 16 or group % 2):
        raise ValueError(f"the pairs layout needs N % 16 == 0 and an even group, not "
                         f"N = {n}, group {group}")


def quantize_int8(weight: torch.Tensor, group: int | None = None,
                  layout: str = ROWS) -> QuantizedWeight:
    """Symmetric int8 of a 2-D weight, ``group`` inputs per scale (None: the whole row)."""
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    group = k if group is None else group
    _check(weight, group, layout, "int8")
    w = weight.float().reshape(n, k // group, group)
    scales = w.abs().amax(dim=-1) / INT8_MAX
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.clamp(torch.round(w / scales[..., None]), -INT8_MAX, INT8_MAX).to(torch.int8)
    q = QuantizedWeight("int8", ROWS, (n, k), group, q.reshape(n, k).contiguous(),
                        scales.contiguous())
    return q if layout == ROWS else to_pairs(q)


def quantize_int4(weight: torch.Tensor, group: int = 32, layout: str = ROWS) -> QuantizedWeight:
    """Asymmetric int4 of a 2-D weight in groups of ``group`` inputs along K."""
    _check(weight, group, layout, "int4")
    n, k = weight.shape
    w = weight.float().reshape(n, k // group, group)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    scales = (hi - lo) / INT4_MAX
    scales, lo = _as_half(torch.where(scales > 0, scales, torch.ones_like(scales)), lo)
    q = torch.clamp(torch.round((w - lo[..., None]) / scales[..., None]), 0, INT4_MAX)
    q = QuantizedWeight("int4", ROWS, (n, k), group, q.to(torch.uint8).reshape(n, k),
                        scales.contiguous(), lo.contiguous())
    return q if layout == ROWS else to_pairs(q)


def _as_half(scales: torch.Tensor, mins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int4's ``scales`` and ``mins`` as float16 values (float32 tensors): each scale rounded
    up (no group's range outgrows 15 steps), each min to nearest; unchanged where a value
    leaves float16's normal range (a scale under 2^-14 or either over 65504)."""
    tiny, huge = torch.finfo(torch.float16).tiny, torch.finfo(torch.float16).max
    if bool((scales < tiny).any()) or max(float(scales.max()), float(mins.abs().max())) > huge:
        return scales, mins
    half = scales.half()
    up = torch.where(half.float() < scales, torch.nextafter(half, torch.full_like(half, huge)),
                     half)
    return up.float(), mins.half().float()


def narrow_scales(q: QuantizedWeight) -> QuantizedWeight | None:
    """``q`` (int4) with its scales and mins stored as float16 where each is a float16 value
    (the same weight, 2 bytes less a scale and a min), else None."""
    if q.scheme != "int4" or q.mins is None or q.scales.dtype == torch.float16:
        return None
    scales, mins = q.scales.half(), q.mins.half()
    if not (torch.equal(scales.float(), q.scales) and torch.equal(mins.float(), q.mins)):
        return None
    return replace(q, scales=scales, mins=mins)


def to_pairs(q: QuantizedWeight) -> QuantizedWeight:
    """``q`` (rows layout) in the pairs layout (``N % 16 == 0``, an even group)."""
    if q.layout == PAIRS:
        return q
    n, k = q.shape
    if not q.fits_pairs:
        raise ValueError(f"the pairs layout needs N % 16 == 0 and an even group, not N = {n}, "
                         f"group {q.group}")
    pairs = q.values.view(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3)
    if q.scheme == "int4":
        values = (pairs[..., 0] | (pairs[..., 1] << 4)).contiguous()
    else:
        values = pairs.contiguous()

    def pack(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        return t.view(n // 16, 16, k // q.group).permute(0, 2, 1).contiguous()

    return QuantizedWeight(q.scheme, PAIRS, q.shape, q.group, values, pack(q.scales),  # type: ignore[arg-type]
                           pack(q.mins), input_scale=q.input_scale)


def regroup(q: QuantizedWeight, group: int) -> QuantizedWeight:
    """``q`` (rows layout) with ``group`` inputs per scale, ``group`` dividing ``q.group``:
    each scale (and min) repeated, the same values exactly."""
    if group == q.group:
        return q
    if q.group % group:
        raise ValueError(f"group {group} does not divide {q.group}")

    def spread(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.repeat_interleave(q.group // group, dim=1)

    return QuantizedWeight(q.scheme, ROWS, q.shape, group, q.values, spread(q.scales),  # type: ignore[arg-type]
                           spread(q.mins))


def concat_rows(parts: list[QuantizedWeight]) -> tuple[QuantizedWeight, int]:
    """One weight of ``parts`` (rows layout, the same K) stacked along N (a fused q/k/v or
    gate/up), and how many parts changed form: all int4 (or all int8) keep their integers,
    under the greatest common group; int4 beside int8 parts become int8 (quantized from their
    values, within half an int8 step: int8 has no offsets)."""
    scheme = "int8" if any(p.scheme == "int8" for p in parts) else "int4"
    changed = 0
    same = []
    for p in parts:
        if p.scheme != scheme:
            group = p.group if scheme == "int4" else math.gcd(
                *[x.group for x in parts if x.scheme == "int8"])
            p = quantize_int8(p.dequantize(torch.float32), group)
            changed += 1
        same.append(p)
    group = math.gcd(*[p.group for p in same])
    same = [regroup(p, group) for p in same]

    def cat(name: str) -> torch.Tensor | None:
        ts = [getattr(p, name) for p in same]
        return None if ts[0] is None else torch.cat(ts)

    n = sum(p.shape[0] for p in same)
    return QuantizedWeight(scheme, ROWS, (n, same[0].shape[1]), group, cat("values"),  # type: ignore[arg-type]
                           cat("scales"), cat("mins")), changed  # type: ignore[arg-type]
