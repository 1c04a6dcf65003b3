"""The mixture-of-experts MLP block (Qwen3-MoE): top-k routing and the experts as one grouped
matmul per projection for the whole step.

Routing as transformers computes it: router logits, softmax in float32, the top ``k`` experts
per token, renormalised over those ``k`` when ``norm_topk_prob``, cast to the activations'
dtype. The ``T * k`` (token, expert) pairs are sorted by expert, and each projection runs as
one grouped matmul over the experts' stacked weights (``ops.grouped_mm``, groups by the sorted
offsets: torch's ``_grouped_mm``, or our grouped GEMVs reading only the routed experts, where
their probe admitted them: over :class:`PackedExperts` in bfloat16 on AVX512-BF16 CPUs, over
the stacked weights at decode sizes elsewhere): no Python loop over experts. Outputs are
weighted and summed back per token with one ``index_add_``.
"""

from __future__ import annotations

import torch

from hermes_async.model.layer_ops import TorchLayerOps
from hermes_async.model.packed import PackedExperts


def route(logits: torch.Tensor, top_k: int, norm_topk_prob: bool,
          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, k] in dtype, experts [T, k])`` from router logits ``[T, E]``."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(dtype), experts


def moe_mlp(ops: TorchLayerOps, x: torch.Tensor, router: torch.Tensor,
            gate_up: torch.Tensor | PackedExperts, down: torch.Tensor | PackedExperts,
            top_k: int, norm_topk_prob: bool) -> torch.Tensor:
    """The block's output for ``x`` ``[T, hidden]``; ``router`` ``[E, hidden]``, ``gate_up``
    ``[E, hidden, 2 * I]`` and ``down`` ``[E, I, hidden]`` (stacked, ``x @ W`` layout, or
    packed)."""
    num_experts = router.shape[0]
    weights, experts = route(ops.linear(x, router), top_k, norm_topk_prob, x.dtype)
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    tokens = order // top_k
    offsets = torch.bincount(flat, minlength=num_experts).cumsum(0).to(torch.int32)
    h = ops.grouped_mm(x[tokens], gate_up, offsets)
    y = ops.grouped_mm(ops.act_mul(h), down, offsets)
    y = y * weights.reshape(-1)[order, None]
    return torch.zeros_like(x).index_add_(0, tokens, y)
