"""One constrained sequence's grammar state (implements :class:`hermes_async.step.TokenConstraint`).

Threading: the sampler calls :meth:`fill_bitmask` in the forward worker thread, the engine calls
:meth:`accept` on the loop after the step; a step is planned only after the previous one was
committed, so the two never overlap for one sequence. Preemption (recompute) keeps a sequence's
output tokens, hence its matcher state stays valid and needs no rebuild.
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
