"""Cascade (shared-prefix) attention for decodes.

When many decoding sequences share a cached prefix (a fixed system prompt: the main
case), they point at the same physical blocks. Instead of gathering that prefix once per
sequence, a group's queries attend to it together in one matmul, each sequence attends to its
own suffix, and the two partial softmaxes are merged exactly with their log-sum-exp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hermes_async.step import SequenceStep

MIN_SHARED_BLOCKS = 2
MIN_GROUP = 2


@dataclass
class CascadeGroup:
    """Decodes ``[start, end)`` of the packed batch sharing ``prefix_table``'s blocks."""

    start: int
    end: int
    prefix_table: torch.Tensor  # [P] long
    suffix_tables: torch.Tensor  # [G, W] long, padded with block 0
    suffix_lens: torch.Tensor  # [G] long: context tokens after the shared prefix


def plan_groups(decodes: Sequence[SequenceStep],
                block_size: int) -> list[tuple[list[int], int]]:
    """Decodes grouped by a shared leading block: (member indices, shared block count) per
    group. Singletons and groups sharing fewer than ``MIN_SHARED_BLOCKS`` are left out."""
    by_first: dict[int, list[int]] = {}
    for i, s in enumerate(decodes):
        if (s.context_len - 1) // block_size >= MIN_SHARED_BLOCKS:
            by_first.setdefault(s.block_table[0], []).append(i)
    groups = [(g, shared_blocks(decodes, g, block_size)) for g in by_first.values()
              if len(g) >= MIN_GROUP]
    return [(g, n) for g, n in groups if n >= MIN_SHARED_BLOCKS]


def shared_blocks(decodes: Sequence[SequenceStep], group: list[int], block_size: int) -> int:
    """Leading blocks common to every member, never reaching a member's last (written) one."""
    limit = min((decodes[i].context_len - 1) // block_size for i in group)
    first = decodes[group[0]].block_table
    n = 0
    while n < limit and all(decodes[i].block_table[n] == first[n] for i in group):
        n += 1
    return n


def build_group(decodes: Sequence[SequenceStep], start: int, n_shared: int, block_size: int,
                device: torch.device) -> CascadeGroup:
    """Tensors of one group whose members are ``decodes`` (already in packed order)."""
    need = [-(-s.context_len // block_size) for s in decodes]
    width = max(need) - n_shared
    rows = [list(s.block_table[n_shared:k]) + [0] * (width - (k - n_shared))
            for s, k in zip(decodes, need, strict=True)]
    return CascadeGroup(
        start, start + len(decodes),
        torch.tensor(decodes[0].block_table[:n_shared], dtype=torch.long, device=device),
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor([s.context_len - n_shared * block_size for s in decodes],
                     dtype=torch.long, device=device),
    )


def _partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
             mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unnormalised attention over one key set: (sum p*v, max score, sum p); fp32 stats."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    p = torch.exp(scores - m)
    return torch.matmul(p.to(v.dtype), v).float(), m, p.sum(dim=-1, keepdim=True)


def cascade_attention(q: torch.Tensor, kv_blocks: tuple[torch.Tensor, torch.Tensor],
                      group: CascadeGroup, scale: float) -> torch.Tensor:
    """Attention of a group's decode queries ``q`` ``[G, H, d]``; returns ``[G, H, d]``."""
    k_blocks, v_blocks = kv_blocks
    g_size, heads, d = q.shape
    kv_heads = k_blocks.shape[2]
    rep = heads // kv_heads
    # shared prefix: [kvh, G*rep, d] queries against [kvh, Lp, d] keys, one matmul per step
    kp = k_blocks[group.prefix_table].flatten(0, 1).transpose(0, 1)
    vp = v_blocks[group.prefix_table].flatten(0, 1).transpose(0, 1)
    qp = q.view(g_size, kv_heads, rep, d).permute(1, 0, 2, 3).reshape(kv_heads, -1, d)
    o1, m1, l1 = _partial(qp, kp, vp, scale, None)

    def per_seq(x: torch.Tensor) -> torch.Tensor:  # [kvh, G*rep, c] -> [G, kvh, rep, c]
        return x.view(kv_heads, g_size, rep, -1).permute(1, 0, 2, 3)

    o1, m1, l1 = per_seq(o1), per_seq(m1), per_seq(l1)
    # own suffix: [G, kvh, rep, d] queries against [G, kvh, Ls, d]
    ks = k_blocks[group.suffix_tables].flatten(1, 2).transpose(1, 2)
    vs = v_blocks[group.suffix_tables].flatten(1, 2).transpose(1, 2)
    width = ks.shape[2]
    mask = (torch.arange(width, device=q.device)[None, :] < group.suffix_lens[:, None])
    qs = q.view(g_size, kv_heads, rep, d)
    o2, m2, l2 = _partial(qs, ks, vs, scale, mask[:, None, None, :])
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)
    out = (o1 * a1 + o2 * a2) / (l1 * a1 + l2 * a2)
    return out.reshape(g_size, heads, d).to(q.dtype)
