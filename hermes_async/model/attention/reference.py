"""The reference attention backend (``torch``): paged attention in plain torch, CPU and CUDA.

Every other backend is tested against this one.

One step's tokens arrive packed: decodes first (one token each; those sharing a cached prefix
grouped first), then each prefill chunk as a contiguous run. Every layer writes the new K/V
into the pool through ``slot_mapping`` and then attends over each sequence's blocks: decodes
sharing a prefix through cascade attention (:mod:`hermes_async.model.cascade`), the other
decodes in one batched call (block tables padded, padding masked), each prefill chunk in its own
call (causal, offset by the cached prefix it starts after).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from hermes_async.model.attention.base import AttentionBackend, AttentionPlan, Ordering
from hermes_async.model.attention.cascade import (
    MIN_GROUP,
    CascadeGroup,
    build_group,
    cascade_attention,
    plan_groups,
)
from hermes_async.step import SequenceStep


@dataclass
class PrefillChunk:
    """New tokens ``[token_start, token_end)`` of one sequence, the first at ``start_pos``."""

    token_start: int
    token_end: int
    start_pos: int
    block_table: torch.Tensor  # [num_blocks] long, covering start_pos + (token_end - token_start)
    _masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return self.token_end - self.token_start

    @property
    def context_len(self) -> int:
        return self.start_pos + self.num_tokens

    def mask(self, window: int | None, device: torch.device) -> torch.Tensor | None:
        """Boolean ``[q, ctx]`` mask (True = attend), or None when plain causal suffices."""
        if window not in self._masks:
            if self.start_pos == 0 and window is None:
                self._masks[window] = None
            else:
                q_pos = torch.arange(self.start_pos, self.context_len, device=device)[:, None]
                k_pos = torch.arange(self.context_len, device=device)[None, :]
                allowed = k_pos <= q_pos
                if window is not None:
                    allowed &= k_pos > q_pos - window
                self._masks[window] = allowed
        return self._masks[window]


@dataclass
class AttentionMetadata(AttentionPlan):
    """Per-step attention inputs shared by every layer."""

    slot_mapping: torch.Tensor  # [T] long: block_id * block_size + offset of each new token
    num_decodes: int
    decode_block_tables: torch.Tensor | None  # [B', max_blocks] long (plain decodes), pad 0
    decode_context_lens: torch.Tensor | None  # [B'] long
    prefills: list[PrefillChunk]
    block_size: int
    cascade_groups: list[CascadeGroup] = field(default_factory=list)
    num_cascade: int = 0  # decodes [0, num_cascade) are in cascade groups, the rest plain
    _decode_masks: dict[int | None, torch.Tensor] = field(default_factory=dict)

    def decode_mask(self, window: int | None) -> torch.Tensor:
        """Boolean ``[B, 1, 1, max_blocks * block_size]`` mask hiding padding (and the window)."""
        if window not in self._decode_masks:
            assert self.decode_block_tables is not None and self.decode_context_lens is not None
            width = self.decode_block_tables.shape[1] * self.block_size
            k_pos = torch.arange(width, device=self.decode_context_lens.device)[None, :]
            lens = self.decode_context_lens[:, None]
            allowed = k_pos < lens
            if window is not None:
                allowed &= k_pos > lens - 1 - window
            self._decode_masks[window] = allowed[:, None, None, :]
        return self._decode_masks[window]

    def attend(self, kv: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, scale: float, window: int | None,
               softcap: float | None = None) -> torch.Tensor:
        k_blocks, v_blocks = kv
        slots = (k_blocks.view(-1, *k_blocks.shape[2:]), v_blocks.view(-1, *v_blocks.shape[2:]))
        return paged_attention(q, k, v, kv, slots, self, scale, window, softcap)


class TorchBackend(AttentionBackend):
    """Plain torch over the ``nhd`` pool; decodes sharing cached blocks go through cascade
    attention (off with sliding windows, whose masks it does not apply)."""

    name = "torch"
    kv_layout = "nhd"
    needs_probe = False  # the reference the probes stand on
    supports_softcap = True

    def __init__(self, block_size: int, device: torch.device, use_cascade: bool = True) -> None:
        self.block_size = block_size
        self.device = device
        self.use_cascade = use_cascade

    def order(self, steps: Sequence[SequenceStep]) -> Ordering:
        """Decodes in cascade groups (group by group), other decodes, prefills; the hint is
        each group's (size, shared block count), in packed order."""
        decodes = [i for i, s in enumerate(steps) if s.is_decode]
        prefills = [i for i, s in enumerate(steps) if not s.is_decode]
        groups: list[tuple[list[int], int]] = []
        if self.use_cascade and len(decodes) >= MIN_GROUP:
            local = plan_groups([steps[i] for i in decodes], self.block_size)
            groups = [([decodes[j] for j in g], n) for g, n in local]
        grouped = {i for g, _ in groups for i in g}
        order = [i for g, _ in groups for i in g] + [i for i in decodes if i not in grouped]
        return Ordering(order + prefills, [(len(g), n) for g, n in groups])

    def plan(self, packed: Sequence[SequenceStep], slot_mapping: torch.Tensor,
             ordering: Ordering) -> AttentionMetadata:
        dev, bs = self.device, self.block_size
        groups: list[tuple[int, int]] = ordering.hint or []  # type: ignore[assignment]
        decodes = [s for s in packed if s.is_decode]
        cascade, start = [], 0
        for size, shared in groups:
            cascade.append(build_group(decodes[start:start + size], start, shared, bs, dev))
            start += size
        plain = decodes[start:]
        tables = lens = None
        if plain:
            need = [-(-s.context_len // bs) for s in plain]
            width = max(need)
            rows = [list(s.block_table[:k]) + [0] * (width - k)
                    for s, k in zip(plain, need, strict=True)]
            tables = torch.tensor(rows, dtype=torch.long, device=dev)
            lens = torch.tensor([s.context_len for s in plain], dtype=torch.long, device=dev)
        prefills, offset = [], len(decodes)
        for s in packed[len(decodes):]:
            need = -(-s.context_len // bs)
            table = torch.tensor(s.block_table[:need], dtype=torch.long, device=dev)
            prefills.append(PrefillChunk(offset, offset + s.num_new_tokens, s.start_pos, table))
            offset += s.num_new_tokens
        return AttentionMetadata(
            slot_mapping=slot_mapping,
            num_decodes=len(decodes), decode_block_tables=tables, decode_context_lens=lens,
            prefills=prefills, block_size=bs, cascade_groups=cascade, num_cascade=start,
        )


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_blocks: tuple[torch.Tensor, torch.Tensor],
    kv_slots: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    scale: float,
    window: int | None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Write ``k``/``v`` (``[T, kv_heads, d]``) into the pool, attend, return ``[T, heads, d]``.

    ``kv_blocks`` are one layer's K and V as ``[num_blocks, block_size, kv_heads, d]``;
    ``kv_slots`` the same memory as ``[num_slots, kv_heads, d]``. ``softcap``: soft-capped
    scores (explicit matmuls; no cascade groups are planned then).
    """
    k_slots, v_slots = kv_slots
    k_slots.index_copy_(0, meta.slot_mapping, k)
    v_slots.index_copy_(0, meta.slot_mapping, v)
    k_blocks, v_blocks = kv_blocks
    out = torch.empty_like(q)
    for group in meta.cascade_groups:
        out[group.start:group.end] = cascade_attention(q[group.start:group.end], kv_blocks,
                                                       group, scale)
    c, b = meta.num_cascade, meta.num_decodes
    if b > c:
        bt = meta.decode_block_tables
        kd = k_blocks[bt].flatten(1, 2)  # [B, L, kvh, d]
        vd = v_blocks[bt].flatten(1, 2)
        mask = meta.decode_mask(window)
        if softcap is not None:
            out[c:b] = _capped_attention(q[c:b].unsqueeze(2), kd.transpose(1, 2),
                                         vd.transpose(1, 2), mask, scale, softcap).squeeze(2)
        elif q.device.type == "cpu" and q.dtype != torch.float32:
            out[c:b] = _decode_attention_matmul(q[c:b], kd, vd, mask, scale)
        else:
            res = F.scaled_dot_product_attention(
                q[c:b].unsqueeze(2), kd.transpose(1, 2), vd.transpose(1, 2), attn_mask=mask,
                scale=scale, enable_gqa=True,
            )
            out[c:b] = res.squeeze(2)
    for chunk in meta.prefills:
        s, e = chunk.token_start, chunk.token_end
        qp = q[s:e].transpose(0, 1).unsqueeze(0)  # [1, H, n, d]
        mask = chunk.mask(window, q.device)
        if softcap is not None:
            ctx = chunk.context_len
            kp = k_blocks[chunk.block_table].flatten(0, 1)[:ctx].transpose(0, 1).unsqueeze(0)
            vp = v_blocks[chunk.block_table].flatten(0, 1)[:ctx].transpose(0, 1).unsqueeze(0)
            if mask is None:  # causal over the whole context
                n = e - s
                mask = torch.ones(n, ctx, dtype=torch.bool, device=q.device).tril(ctx - n)
            res = _capped_attention(qp, kp, vp, mask, scale, softcap)
        elif mask is None:  # fresh prompt, full attention: the new K/V are the whole context
            kp = k[s:e].transpose(0, 1).unsqueeze(0)
            vp = v[s:e].transpose(0, 1).unsqueeze(0)
            res = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale,
                                                 enable_gqa=True)
        else:
            ctx = chunk.context_len
            kp = k_blocks[chunk.block_table].flatten(0, 1)[:ctx].transpose(0, 1).unsqueeze(0)
            vp = v_blocks[chunk.block_table].flatten(0, 1)[:ctx].transpose(0, 1).unsqueeze(0)
            res = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=scale,
                                                 enable_gqa=True)
        out[s:e] = res.squeeze(0).transpose(0, 1)
    return out


def _capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float, softcap: float) -> torch.Tensor:
    """Attention with soft-capped scores (``softcap * tanh(s / softcap)``), float32 softmax:
    ``q`` ``[B, H, n, d]``, ``k``/``v`` ``[B, kvh, L, d]``, ``mask`` broadcastable to
    ``[B, H, n, L]`` (True: attend)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v.float()).to(q.dtype)


def _decode_attention_matmul(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Single-token attention as two batched matmuls with a float32 softmax.

    On the CPU, torch's flash kernel is slow for one query row in bfloat16 (measured 3x slower
    at batch 32 than this); float32 keeps SDPA. ``q`` ``[B, H, d]``; ``k``/``v`` ``[B, L, kvh, d]``;
    ``mask`` ``[B, 1, 1, L]``. Query head ``h`` reads KV head ``h // (H // kvh)`` as in GQA.
    """
    b, heads, d = q.shape
    kv_heads = k.shape[2]
    qg = q.view(b, kv_heads, heads // kv_heads, d)
    scores = torch.matmul(qg, k.permute(0, 2, 3, 1)).float() * scale  # [B, kvh, g, L]
    scores.masked_fill_(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.matmul(probs, v.permute(0, 2, 1, 3)).reshape(b, heads, d)
