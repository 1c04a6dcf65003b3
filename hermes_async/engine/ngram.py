"""Prompt-lookup drafts (``speculative.method = "ngram"``): what most often followed the
longest earlier occurrence of the sequence's tail.

Torch-free; one :class:`NgramIndex` per sequence, kept up to date as its tokens grow, so a
step's lookup costs a few dictionary probes and a short backward comparison per candidate
(the prompt is indexed once, on its first draft).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

INDEXED_N = 4  # tails up to this long are looked up in the index; longer ones by comparison
CANDIDATES = 64  # occurrences of the indexed tail weighed (the latest ones)


class NgramIndex:
    """Every earlier end of each n-gram (``min_n..min(max_n, INDEXED_N)`` tokens) of a growing
    token list, and the proposal drawn from them.

    ``match(tokens, k)``: the tail of ``tokens`` of ``m = min(max_n, INDEXED_N)`` tokens, or
    failing that the longest shorter one of at least ``min_n``, is looked up among the n-grams
    that end before the last token; of its latest ``CANDIDATES`` occurrences, those whose match
    with the tail reaches furthest back (up to ``max_n`` tokens) are the candidates, and the
    proposal is the ``k`` tokens (fewer where they run into the end) that followed most of
    them, the earliest candidate's on ties. Where the model copies a source, the source's
    occurrence matches the longest tail; where a pattern repeats, its most common
    continuation wins; and ties go to the first occurrence, which in a copy is the prompt's
    text rather than the model's own rendering of it. Returns the proposal and the length of
    the match (0 and nothing when no tail occurred). ``tokens`` must only ever grow by
    appending (a sequence's prompt plus its output).
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError("1 <= min_n <= max_n must hold")
        self.min_n, self.max_n = min_n, max_n
        lengths = range(min_n, min(max_n, INDEXED_N) + 1)
        self._latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in lengths}
        # per n, by end: the previous end of the n-gram that ends there (-1: none, or too short)
        self._previous: dict[int, list[int]] = {n: [] for n in lengths}
        self._indexed = 0  # n-grams ending at every end < this are indexed

    def propose(self, tokens: Sequence[int], k: int) -> tuple[int, ...]:
        return self.match(tokens, k)[0]

    def match(self, tokens: Sequence[int], k: int) -> tuple[tuple[int, ...], int]:
        """As described on the class: ``(proposal, matched length)``."""
        length = len(tokens)
        self._index(tokens, length - 1)  # every earlier end; the tail itself is not one
        top = max(self._latest)
        for n in range(min(top, length - 1), self.min_n - 1, -1):
            end = self._latest[n].get(tuple(tokens[length - n:]), -1)
            if end >= 0:
                break
        else:
            return (), 0
        previous, candidates = self._previous[n], []
        while end >= 0 and len(candidates) < CANDIDATES:
            candidates.append(end)
            end = previous[end]
        candidates.reverse()  # earliest first
        matched = n
        if n < self.max_n and n == top:  # the tail may match further back
            reach = [self._reach(tokens, end, n) for end in candidates]
            matched = max(reach)
            candidates = [end for end, m in zip(candidates, reach, strict=True) if m == matched]
        votes = Counter(tuple(tokens[end:end + k]) for end in candidates)
        return votes.most_common(1)[0][0], matched

    def _reach(self, tokens: Sequence[int], end: int, n: int) -> int:
        """How far back (at most ``max_n``) the tokens before ``end`` equal the tail, given that
        the last ``n`` do."""
        tail = len(tokens)
        while n < self.max_n and end - n > 0 and tokens[end - n - 1] == tokens[tail - n - 1]:
            n += 1
        return n

    def _index(self, tokens: Sequence[int], upto: int) -> None:
        """Index the n-grams ending at ``self._indexed .. upto`` (ends exclusive)."""
        first = self._indexed
        for n, latest in self._latest.items():
            previous = self._previous[n]
            for end in range(first, upto + 1):
                if end < n:
                    previous.append(-1)
                    continue
                gram = tuple(tokens[end - n:end])
                previous.append(latest.get(gram, -1))
                latest[gram] = end
        self._indexed = max(self._indexed, upto + 1)
