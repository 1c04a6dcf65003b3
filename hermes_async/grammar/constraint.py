"""One constrained sequence's grammar state (implements :class:`hermes_async.step.TokenConstraint`).

Threading: the sampler calls :meth:`fill_bitmask` in the forward worker thread, the engine calls
:meth:`accept` on the loop after the step; a step is planned only after the previous one was
committed, so the two never overlap for one sequence. Preemption (recompute) keeps a sequence's
output tokens, hence its matcher state stays valid and needs no rebuild.

Speculative decoding: :meth:`valid_prefix` cuts a draft at the first token the grammar rejects
(on the loop, while planning), and :meth:`ahead` gives each drafted position its own mask (the
state after the drafts before it, reached and rolled back inside the sampler's call); the
matcher itself advances only by :meth:`accept`, on the tokens verification kept.
"""

from __future__ import annotations

import llguidance
import numpy as np


class GrammarConstraint:
    """A fresh matcher over a compiled grammar: allowed-token bitmask, then accept the token."""

    __slots__ = ("_matcher", "vocab_size")

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size

    def fill_bitmask(self, row: np.ndarray) -> None:
        """Write the next token's allowed set into ``row``: int32 words, token ``t`` allowed
        iff bit ``t % 32`` of word ``t // 32`` is set (``ceil(vocab_size / 32)`` words,
        C-contiguous). Drops the GIL while llguidance computes it."""
        if row.dtype != np.int32 or not row.flags["C_CONTIGUOUS"] or \
                row.size != (self.vocab_size + 31) // 32:
            raise ValueError("bitmask row must be C-contiguous int32 of ceil(vocab / 32) words")
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.size * 4)

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many of ``token_ids``, in order from the current state, the grammar allows
        (the state does not change)."""
        return int(self._matcher.validate_tokens(token_ids)) if token_ids else 0

    def forced_tokens(self) -> list[int]:
        """The tokens the grammar forces from here (a draft that is nearly always kept)."""
        return list(self._matcher.compute_ff_tokens())

    def ahead(self, token_ids: tuple[int, ...]) -> DraftPosition:
        """The mask of the position after ``token_ids`` (allowed drafts, not yet accepted)."""
        return DraftPosition(self._matcher, self.vocab_size, list(token_ids))

    def accept(self, token_id: int) -> bool:
        """Advance by the sampled token; False when the grammar rejects it (then the
        constraint is in an error state for good)."""
        return bool(self._matcher.consume_token(token_id))

    @property
    def is_finished(self) -> bool:
        """The grammar is complete and allows nothing but EOS: the sequence can end here."""
        return bool(self._matcher.is_stopped())

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() or None if self._matcher.is_error() else None


class DraftPosition:
    """The allowed set after a sequence's drafts: the matcher consumes them, fills the mask and
    rolls them back, so its state is unchanged after each call (the drafts were validated by
    :meth:`GrammarConstraint.valid_prefix` when they were proposed)."""

    __slots__ = ("_matcher", "_token_ids", "vocab_size")

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int,
                 token_ids: list[int]) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size
        self._token_ids = token_ids

    def fill_bitmask(self, row: np.ndarray) -> None:
        """As :meth:`GrammarConstraint.fill_bitmask`, after the drafts."""
        if row.dtype != np.int32 or not row.flags["C_CONTIGUOUS"] or \
                row.size != (self.vocab_size + 31) // 32:
            raise ValueError("bitmask row must be C-contiguous int32 of ceil(vocab / 32) words")
        if not self._matcher.consume_tokens(self._token_ids):
            raise ValueError(f"drafts {self._token_ids} are not allowed by the grammar")
        try:
            self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.size * 4)
        finally:
            self._matcher.rollback(len(self._token_ids))
