"""Int8 activations in blocks of 32 (``model.activations = "int8"``): W4A8 and W8A8.

Where asked, the input of an int8 / int4 linear (in every step: decodes and prefill
chunks) is quantized per row in blocks of :data:`BLOCK` inputs, as llama.cpp
quantizes the activations of its Q8_0 / Q4 matmuls: symmetric, ``d = max|x| / 127`` over the
block, ``q = round(x / d)`` (to nearest, ties to even) in ``[-127, 127]``, an all-zero block
``d = 0``. The kernels (``int4_a8_gemv`` / ``int8_a8_gemv``, the ``native-int4-a8`` /
``native-int8-a8`` paths) then multiply the weight's integers by these bytes exactly and scale
the sums: the product is ``x^ = q * d`` times the dequantized weight, up to float32 rounding.
:func:`dequantize_blocks` is ``x^``, the oracle's input; the rounding of up to half a step
(``max|x| / 254``) per element is this setting's approximation, measured by
``loadtest/bench_quant_quality.py``.
"""

from __future__ import annotations

import torch

from hermes_async.model.quant.weights import INT8_MAX

BLOCK = 32  # inputs per activation scale


def quantize_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[M, K]`` (``K % BLOCK == 0``) as int8 ``[M, K]`` and float32 scales
    ``[M, K / BLOCK]``, as the kernel computes them (float32 division, round half to even)."""
    m, k = x.shape
    if k % BLOCK:
        raise ValueError(f"int8 activations take K in multiples of {BLOCK}, not {k}")
    blocks = x.float().reshape(m, k // BLOCK, BLOCK)
    scales = blocks.abs().amax(dim=2, keepdim=True) / INT8_MAX
    divisor = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.where(scales > 0, torch.round(blocks / divisor), torch.zeros_like(blocks))
    q = torch.clamp(q, -INT8_MAX, INT8_MAX).to(torch.int8)
    return q.reshape(m, k), scales.reshape(m, k // BLOCK)


def dequantize_blocks(x: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``x^ = q * d``: ``x`` ``[M, K]`` as the kernel sees it, in ``dtype``."""
    q, scales = quantize_blocks(x)
    m, k = x.shape
    return (q.to(dtype).reshape(m, k // BLOCK, BLOCK)
            * scales.to(dtype).unsqueeze(2)).reshape(m, k)
