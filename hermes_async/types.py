"""Plain data shared by the layers (stdlib only: no torch, no asyncio).

The engine describes one forward step as a tuple of :class:`SequenceStep`; the model runner
turns it into one packed batch. Nothing here knows about HTTP or JSON.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SequenceStep:
    """One sequence's share of a forward step.

    block_table: physical KV block ids of the sequence, in token order, covering at least
        ``start_pos + len(token_ids)`` tokens (the prefix tree's blocks first, then private ones).
    start_pos: position of the first new token: the matched (cached) length for a prefill, the
        index of the last token for a decode. K/V of positions ``< start_pos`` must already be in
        the pool at those blocks.
    token_ids: the new tokens to compute; their K/V are written into the pool by this step.
    """

    block_table: tuple[int, ...]
    start_pos: int
    token_ids: tuple[int, ...]

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        """Tokens attended by the last new token (cached prefix plus new tokens)."""
        return self.start_pos + len(self.token_ids)
