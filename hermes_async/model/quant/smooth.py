"""Smoothing for W8A8 (SmoothQuant's idea, our code): move the activations' outlier channels
into the weights before both are rounded to int8.

Per-token int8 activations lose most where a few input channels are far larger than the rest
(every other channel then gets only a few of the 255 steps): on the default model, W8A8 without
smoothing agrees with the unquantized model's greedy token at 84% of positions, int8 weights
alone at 94% (``loadtest/bench_quant_quality.py``). For a linear with input channel maxima
``a_j`` (measured) and weight column maxima ``b_j``, ``s_j = a_j^alpha / b_j^(1 - alpha)``:
the weight's columns are multiplied by ``s`` before quantizing, the activations divided by it
(``QuantizedWeight.input_scale = 1 / s``, applied to each row before its quantization: one
multiply per activation, far less than the matmul), so the product is unchanged and both
operands are flatter.

The maxima come from a calibration forward at start-up over :data:`CALIBRATION_TEXT` (plain
prose, code and a chat turn, tokenized by the model's tokenizer; shipped here, so every start
computes the same scales) and a sequence of random token ids, through the plain ops in the
model's dtype: about a second for a 1.7B model on two cores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

ALPHA = 0.5  # SmoothQuant's default migration strength
RANDOM_TOKENS = 128
MIN_SCALE = 1e-5
CALIBRATION_TEXT = """\
The committee met on Tuesday to review the budget for the coming year. After a long
discussion about transport, housing and the new library, the members agreed to publish the
figures online and to ask residents for their views before the final vote in March.

def merge(intervals):
    intervals.sort(key=lambda pair: pair[0])
    out = [intervals[0]]
    for start, end in intervals[1:]:
        if start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out

User: How many kilometres is a marathon, and why that number?
Assistant: A marathon is 42.195 km. The distance was fixed in 1921, after the 1908 London
Olympics ran from Windsor Castle to the stadium's royal box.
"""


class ActivationRecorder:
    """Layer ops that record, per float weight (by ``data_ptr``), the largest magnitude of
    each input channel its linears saw, and otherwise delegate to ``ops``."""

    def __init__(self, ops: Any) -> None:
        self._ops = ops
        self.maxima: dict[int, torch.Tensor] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def linear(self, x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None) -> Any:
        if isinstance(weight, torch.Tensor):
            seen = x.reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
            key = weight.data_ptr()
            prev = self.maxima.get(key)
            self.maxima[key] = seen if prev is None else torch.maximum(prev, seen)
        return self._ops.linear(x, weight, bias)


def calibration_sequences(encode: Callable[[str], list[int]] | None, vocab_size: int,
                          seed: int = 0) -> list[list[int]]:
    """The calibration text's token ids (when ``encode`` is given) and random ids."""
    gen = torch.Generator().manual_seed(seed)
    out = [torch.randint(0, vocab_size, (RANDOM_TOKENS,), generator=gen).tolist()]
    if encode is not None:
        out.insert(0, [t for t in encode(CALIBRATION_TEXT) if 0 <= t < vocab_size])
    return out


def smoothing_scales(weight: torch.Tensor, activation_max: torch.Tensor,
                     alpha: float = ALPHA) -> torch.Tensor:
    """``s`` ``[K]`` (float32) for an ``[N, K]`` weight whose inputs peaked at
    ``activation_max`` ``[K]``: ``a^alpha / b^(1 - alpha)``, 1 where either is zero."""
    a = activation_max.float().clamp_min(0)
    b = weight.float().abs().amax(dim=0)
    s = a.pow(alpha) / b.pow(1 - alpha)
    ok = (a > 0) & (b > 0) & torch.isfinite(s)
    return torch.where(ok, s.clamp_min(MIN_SCALE), torch.ones_like(s))
