"""Weights re-laid at load for a kernel, in place of the loaded tensor: the mixture-of-experts
block's stacked experts in our GEMV's pair layout (:class:`PackedExperts`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedExperts:
    """Stacked bfloat16 experts ``[E, K, N]`` (``x @ W``) re-laid for our GEMV at load, in
    place of the stacked tensor: ``packed`` ``[E, N / 16, K / 2, 16]`` int32, each expert in
    ``gemv_packed``'s pair layout (``hermes_native::pack_experts``)."""

    packed: torch.Tensor
    shape: tuple[int, int, int]  # (E, K, N)

    def unpack(self) -> torch.Tensor:
        """The stacked ``[E, K, N]`` bfloat16 weights again (the reference's operand)."""
        e, k, n = self.shape
        pairs = self.packed.view(torch.bfloat16).view(e, n // 16, k // 2, 16, 2)
        return pairs.permute(0, 2, 4, 1, 3).reshape(e, k, n)
