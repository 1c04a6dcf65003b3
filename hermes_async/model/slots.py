"""Where a packed step's new tokens go: their absolute positions and pool slots.

A slot is ``block_id * block_size + offset``: the runner writes each new token's K/V there, and
the kernel probes (:mod:`hermes_async.model.kernels`) build their steps the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hermes_async.step import SequenceStep


def positions_and_slots(packed: Sequence[SequenceStep],
                        block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Absolute position and pool slot of every new token, in packed order (int64, CPU).
    Decodes (one token each, packed first) in plain Python; prefill chunks vectorised."""
    bs = block_size
    decodes = [s for s in packed if s.is_decode]
    pos_parts = [torch.tensor([s.start_pos for s in decodes], dtype=torch.long)]
    slot_parts = [torch.tensor([s.block_table[s.start_pos // bs] * bs + s.start_pos % bs
                                for s in decodes], dtype=torch.long)]
    for s in packed[len(decodes):]:
        pos = torch.arange(s.start_pos, s.context_len, dtype=torch.long)
        table = torch.tensor(s.block_table[: -(-s.context_len // bs)], dtype=torch.long)
        pos_parts.append(pos)
        slot_parts.append(table[pos // bs] * bs + pos % bs)
    return torch.cat(pos_parts), torch.cat(slot_parts)
