"""Quantizing a loaded model's linears at start-up (``model.quantization``).

Every decoder layer's attention and dense MLP projections (``qkv``, ``o``, ``gate_up``,
``down``) and the LM head become :class:`~.weights.QuantizedWeight`: the float parameter is
dropped (a tied head keeps the embedding table for the lookup and gains a quantized copy).
The MoE router (small, and its top-k is sensitive) and the stacked experts stay as they are.
A weight the chosen layout cannot hold (``pairs``: ``N % 16``; int4: ``K`` not a multiple of
its group) keeps its float copy; the report says which. Schemes: ``int8`` (per output
channel), ``int4`` (groups of 32 along K, asymmetric), ``int4-g128`` (groups of 128),
``w8a8`` (``int8``'s weights, the activations quantized per token too: :mod:`.w8a8`).

``gguf`` is not quantized here: the loader reads a GGUF's blocks into int8 / int4 weights
(rows layout, :mod:`hermes_async.model.gguf.blocks`) and :func:`to_kernel_layout` moves those
the admitted kernels take into the pairs layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hermes_async.model.quant.w8a8 import quantize_w8a8
from hermes_async.model.quant.weights import (
    PAIRS,
    ROWS,
    W8A8,
    QuantizedWeight,
    quantize_int4,
    quantize_int8,
    to_pairs,
)

GGUF = "gguf"  # a GGUF's own blocks, read by the loader
SCHEMES = ("none", "int8", "int4", "int4-g128", W8A8)
INT4_GROUPS = {"int4": 32, "int4-g128": 128}
LAYER_WEIGHTS = ("qkv_weight", "o_weight", "gate_up_weight", "down_weight")


@dataclass
class QuantReport:
    """What :func:`quantize_model` did: the scheme and layout, the weights' bytes before and
    after (those it quantized), and the weights it left in float."""

    scheme: str
    layout: str
    quantized: int = 0
    smoothed: int = 0  # W8A8 weights with calibrated smoothing (.smooth)
    bytes_before: int = 0
    bytes_after: int = 0
    kept_float: list[str] = field(default_factory=list)
    # gguf: tensors by what they became ("Q4_K -> int4"), and fused parts that became int8
    sources: dict[str, int] = field(default_factory=dict)
    fused_to_int8: int = 0

    def add(self, weight: torch.Tensor, q: QuantizedWeight, sources: Sequence[str] = (),
            fused_to_int8: int = 0) -> None:
        """Count ``weight`` (its float size), quantized as ``q`` (from GGUF tensors:
        ``sources`` say what each part became, ``fused_to_int8`` how many changed form)."""
        self.quantized += 1
        self.smoothed += q.input_scale is not None
        self.bytes_before += weight.numel() * weight.element_size()
        self.bytes_after += q.nbytes
        for s in sources:
            self.sources[s] = self.sources.get(s, 0) + 1
        self.fused_to_int8 += fused_to_int8

    def describe(self) -> str:
        kept = f"; kept in float: {', '.join(self.kept_float)}" if self.kept_float else ""
        smoothed = f" ({self.smoothed} smoothed)" if self.smoothed else ""
        sources = (f" [{', '.join(f'{n} {s}' for s, n in sorted(self.sources.items()))}"
                   + (f"; {self.fused_to_int8} 4-bit parts of fused weights as int8"
                      if self.fused_to_int8 else "") + "]") if self.sources else ""
        return (f"{self.scheme} weights ({self.layout} layout): {self.quantized} linears"
                f"{smoothed}{sources}, "
                f"{self.bytes_before / 2**20:.0f} MiB -> {self.bytes_after / 2**20:.0f} MiB{kept}")


def _quantize(weight: torch.Tensor, scheme: str, layout: str,
              activation_max: torch.Tensor | None = None) -> QuantizedWeight | None:
    if scheme not in SCHEMES[1:]:
        raise ValueError(f"model.quantization must be one of {', '.join(SCHEMES)}, not "
                         f"{scheme!r}")
    if layout == PAIRS and (weight.shape[0] % 16 or weight.shape[1] % 2):
        return None
    if scheme == "int8":
        return quantize_int8(weight, layout=layout)
    if scheme == W8A8:
        return quantize_w8a8(weight, activation_max)
    group = INT4_GROUPS[scheme]
    if weight.shape[1] % group:
        return None
    return quantize_int4(weight, group, layout)


def quantize_model(model: torch.nn.Module, scheme: str, layout: str = ROWS,
                   activation_maxima: dict[int, torch.Tensor] | None = None) -> QuantReport:
    """Quantize ``model``'s linears in place (a :class:`~hermes_async.model.llama.LlamaModel`)
    with ``scheme`` in ``layout``; the report for the start-up log. ``activation_maxima``
    (W8A8: each float weight's input channel maxima by ``data_ptr``, from
    :class:`~.smooth.ActivationRecorder`) smooths the weights that have them."""
    report = QuantReport(scheme, layout)
    maxima = activation_maxima or {}

    def take(owner: torch.nn.Module, name: str, label: str) -> None:
        weight = getattr(owner, name)
        if weight is None:
            return
        q = _quantize(weight.data, scheme, layout, maxima.get(weight.data_ptr()))
        if q is None:
            report.kept_float.append(f"{label} {tuple(weight.shape)}")
            return
        report.add(weight, q)
        del owner._parameters[name]
        setattr(owner, name, q)

    for i, layer in enumerate(model.layers):  # type: ignore[attr-defined]
        for name in LAYER_WEIGHTS:
            take(layer, name, f"layer {i} {name}")
    head = model.head_weight  # type: ignore[attr-defined]
    q = _quantize(head.data, scheme, layout, maxima.get(head.data_ptr()))
    if q is None:
        report.kept_float.append(f"lm head {tuple(head.shape)}")
    else:
        report.add(head, q)
        if model.lm_head is not None:  # type: ignore[attr-defined]
            del model._parameters["lm_head"]
            model.lm_head = None  # type: ignore[attr-defined]
        model.quantized_head = q  # type: ignore[attr-defined]
    return report


def to_kernel_layout(model: torch.nn.Module, schemes: frozenset[str]) -> int:
    """Move ``model``'s quantized weights (rows layout) of ``schemes`` (those whose kernels
    were admitted) into the pairs layout where it holds them (``N % 16``, even groups): the
    linears, the LM head and an untied token table kept as blocks; the number moved. The rest
    stay in rows for the reference."""
    moved = 0

    def move(q: object) -> object:
        nonlocal moved
        if (not isinstance(q, QuantizedWeight) or q.layout != ROWS or q.scheme not in schemes
                or not q.fits_pairs):
            return q
        moved += 1
        return to_pairs(q)

    for layer in model.layers:  # type: ignore[attr-defined]
        for name in LAYER_WEIGHTS:
            if isinstance(getattr(layer, name, None), QuantizedWeight):
                setattr(layer, name, move(getattr(layer, name)))
    for name in ("quantized_head", "quantized_embed"):
        setattr(model, name, move(getattr(model, name)))
    return moved
