"""W8A8 (``model.quantization = "w8a8"``): int8 weights times int8 activations.

The weight is int8 per output channel (:func:`~.weights.quantize_int8`: ``w ~ q_w * s_w``);
the activations are quantized per row (per token) when the step comes: symmetric,
``s_x = max|x| / 127`` over the row, ``q_x = round(x / s_x)`` in ``[-127, 127]``. Then
``y = (q_x @ q_w.T) * s_x * s_w``: the integer product is exact (int32), so a kernel differs
from :func:`reference` only by float rounding of the scaling (and, rarely, one step of an
activation rounded the other way at a tie). The activations' rounding, up to half a step
(``max|x| / 254``) per element, is this scheme's approximation beyond the weights' own:
measured by ``loadtest/bench_quant_quality.py`` like every scheme.

The point is speed where int8 multiplies natively: oneDNN's int8 matmul (vLLM's
``onednn_scaled_mm``, the ``onednn-w8a8`` path) runs on AMX-INT8 tiles or VNNI, at every row
count faster than the bfloat16 matmul on an AMX Xeon (BENCHMARKS.md).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from hermes_async.model.quant.smooth import smoothing_scales
from hermes_async.model.quant.weights import INT8_MAX, W8A8, QuantizedWeight, quantize_int8


def quantize_w8a8(weight: torch.Tensor,
                  activation_max: torch.Tensor | None = None) -> QuantizedWeight:
    """A W8A8 weight (rows layout: the kernel prepacks its own copy): ``int8``'s integers,
    smoothed (:mod:`.smooth`) where the input channels' maxima ``activation_max`` are given."""
    if activation_max is None:
        return replace(quantize_int8(weight), scheme=W8A8)
    s = smoothing_scales(weight, activation_max)
    return replace(quantize_int8(weight.float() * s), scheme=W8A8, input_scale=1 / s)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[M, K]`` as int8 ``[M, K]`` and float32 scales ``[M, 1]`` (symmetric, per
    row; an all-zero row gets scale 1)."""
    xf = x.float()
    scales = xf.abs().amax(dim=1, keepdim=True) / INT8_MAX
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.clamp(torch.round(xf / scales), -INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scales


def reference(x: torch.Tensor, weight: QuantizedWeight,
              dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``x`` ``[..., K]`` times the weight as W8A8 computes it, in ``dtype`` (float64: the
    kernels' oracle): ``(q_x * s_x) @ (q_w * s_w).T``, ``[..., N]``, ``q_x`` of ``x`` times
    the weight's ``input_scale`` where it is smoothed (:mod:`.smooth`)."""
    n, k = weight.shape
    rows = x.reshape(-1, k)
    if weight.input_scale is not None:  # smoothed: the weight's integers hold w / input_scale
        rows = rows.float() * weight.input_scale
    q, scales = quantize_rows(rows)
    q_w, s_w, _ = weight.rows()
    out = (q.to(dtype) * scales.to(dtype)) @ (q_w.to(dtype) * s_w.to(dtype)).T
    return out.view(*x.shape[:-1], n)
