"""Prompt-lookup drafts (``speculative.method = "ngram"``): the tokens that followed the latest
earlier occurrence of the sequence's suffix.

Torch-free; one :class:`NgramIndex` per sequence, kept up to date as its tokens grow, so a
step's lookup costs a few dictionary probes (the prompt is indexed once, on its first draft).
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Where each n-gram (``min_n..max_n`` tokens) of a growing token list last ended.

    ``propose(tokens, k)`` looks up the suffix of ``tokens``, longest first, among the n-grams
    that end before the last token, and returns up to ``k`` tokens that followed the latest
    such occurrence (fewer where it runs into the end; none when no suffix occurred). ``tokens``
    must only ever grow by appending (a sequence's prompt plus its output).
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError("1 <= min_n <= max_n must hold")
        self.min_n, self.max_n = min_n, max_n
        self._ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in
                                                             range(min_n, max_n + 1)}
        self._indexed = 0  # n-grams ending at every end < this are in _ends

    def propose(self, tokens: Sequence[int], k: int) -> tuple[int, ...]:
        return self.match(tokens, k)[0]

    def match(self, tokens: Sequence[int], k: int) -> tuple[tuple[int, ...], int]:
        """As :meth:`propose`, with the length of the suffix that matched (0: none)."""
        length = len(tokens)
        self._index(tokens, length - 1)  # every earlier end; the suffix itself is not one
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            end = self._ends[n].get(tuple(tokens[length - n:]))
            if end is not None:
                return tuple(tokens[end:end + k]), n
        return (), 0

    def _index(self, tokens: Sequence[int], upto: int) -> None:
        """Record the n-grams ending at ``self._indexed .. upto`` (ends exclusive)."""
        for end in range(max(self._indexed, self.min_n), upto + 1):
            for n, ends in self._ends.items():
                if end >= n:
                    ends[tuple(tokens[end - n:end])] = end
        self._indexed = max(self._indexed, upto + 1)
