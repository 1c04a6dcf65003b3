"""The divergence detector's search: where a prompt lines up again with a recent one.

Pure functions of two prompts' tokens and block hashes (the rules are in
:mod:`hermes_async.observe.divergence`): :class:`Realigner` finds the newest candidate through
a block index, measures the differing span token by token, and follows the realigned run,
repeating after each break (a second dynamic field).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SHIFTS = (0, 1, -1, 2, -2)  # token offsets tried after a span (a field that grew or shrank)


class PromptSample:
    """A prompt's tokens (``array('i')``), per-block hashes and chained prefix hashes."""

    __slots__ = ("tokens", "hashes", "chain")

    def __init__(self, token_ids: Sequence[int], block_size: int) -> None:
        self.tokens = array("i", token_ids)
        raw = self.tokens.tobytes()
        step = block_size * self.tokens.itemsize
        nb = len(self.tokens) // block_size
        self.hashes = array("q", (hash(raw[k * step:(k + 1) * step]) for k in range(nb)))
        chain = array("q", bytes(8 * nb))
        c = 0
        for k in range(nb):
            c = chain[k] = hash((c, self.hashes[k]))
        self.chain = chain

    def prefix_hash(self, m: int) -> int:
        """Chained hash of blocks ``[0, m)`` (0 for the empty prefix)."""
        return self.chain[m - 1] if m else 0

    def index_keys(self) -> list[int]:
        """Keys of blocks ``1..`` for the block index (block 0 is never a realigned block)."""
        return [index_key(j, self.hashes[j]) for j in range(1, len(self.hashes))]


def index_key(block: int, block_hash: int) -> int:
    """Key of ``(block position, block hash)`` in a block index."""
    return hash((block, block_hash))


@dataclass(frozen=True, slots=True)
class Realignment:
    """One differing span: ``[start, end)`` in the prompt, ``[other_start, other_end)`` in the
    earlier prompt ``other``, and the tokens a block cache would have served after it."""

    start: int
    end: int
    other_start: int
    other_end: int
    tokens_lost: int
    other: PromptSample


class Realigner:
    """Finds realigned spans; ``checks`` counts candidates examined (at most
    ``max_span_blocks * len(SHIFTS)`` per :meth:`find`)."""

    def __init__(self, block_size: int, max_span_blocks: int, min_run_blocks: int) -> None:
        self.block_size = block_size
        self.max_span_blocks = max_span_blocks
        self.min_run_blocks = min_run_blocks
        self.checks = 0

    def find(self, index: Mapping[int, PromptSample], p: PromptSample, m: int,
             limit: int = 8) -> list[Realignment]:
        """Spans of ``p`` (whose cache match stopped at block ``m``) against the newest
        candidate of ``index`` (key -> newest sample with that block), at most ``limit``."""
        bs = self.block_size
        if m >= len(p.hashes) or not index:
            return []
        hit = self._candidate(index, p, m)
        if hit is None:
            return []
        r, j, off = hit
        out: list[Realignment] = []
        off0 = 0
        while len(out) < limit:
            f, run_end = self._measure(p, r, m, off0, j, off)
            if f is not None:
                out.append(f)
            if run_end >= len(r.hashes) or run_end * bs + off >= len(p.tokens):
                break
            m, off0 = run_end, off
            nxt = self._realign(p, r, m, off0)
            if nxt is None:
                break
            j, off = nxt
        return out

    def _candidate(self, index: Mapping[int, PromptSample], p: PromptSample,
                   m: int) -> tuple[PromptSample, int, int] | None:
        """Newest sample sharing blocks ``[0, m)`` with ``p``, differing on block ``m`` and
        equal to ``p`` again on a block ``j`` (at a shift): ``(sample, j, shift)``."""
        bs, toks = self.block_size, p.tokens
        raw = toks.tobytes()
        size = toks.itemsize
        prefix = p.prefix_hash(m)
        for j in range(m + 1, m + self.max_span_blocks + 1):
            for off in SHIFTS:
                lo = j * bs + off
                if lo + bs > len(toks) or lo <= m * bs:
                    continue
                h = p.hashes[j] if off == 0 else hash(raw[lo * size:(lo + bs) * size])
                r = index.get(index_key(j, h))
                if r is None:
                    continue
                self.checks += 1
                if (len(r.hashes) > j and r.hashes[j] == h and r.prefix_hash(m) == prefix
                        and r.hashes[m] != p.hashes[m]
                        and r.tokens[j * bs:(j + 1) * bs] == toks[lo:lo + bs]):
                    return r, j, off
        return None

    def _realign(self, p: PromptSample, r: PromptSample, m: int,
                 off0: int) -> tuple[int, int] | None:
        """After a run of ``r`` broke at block ``m`` (``p`` at shift ``off0``): the first block
        ``j`` of ``r`` that ``p`` repeats again, and the new shift."""
        bs, pt, rt = self.block_size, p.tokens, r.tokens
        for j in range(m + 1, min(m + self.max_span_blocks, len(r.hashes) - 1) + 1):
            block = rt[j * bs:(j + 1) * bs]
            for delta in SHIFTS:
                off = off0 + delta
                lo = j * bs + off
                if lo > m * bs + off0 and lo + bs <= len(pt) and pt[lo:lo + bs] == block:
                    return j, off
        return None

    def _measure(self, p: PromptSample, r: PromptSample, m: int, off0: int, j: int,
                 off: int) -> tuple[Realignment | None, int]:
        """Span and run of one realignment: ``p[i + off0] == r[i]`` before block ``m`` of ``r``,
        ``p[i + off] == r[i]`` from block ``j``. Returns the span (None when the realignment
        rule rejects it) and the block of ``r`` where the run broke."""
        bs, pt, rt = self.block_size, p.tokens, r.tokens
        d, hi = m * bs, j * bs
        while d < hi and d + off0 < len(pt) and pt[d + off0] == rt[d]:
            d += 1
        e = hi
        while e > d and e - 1 + off >= d + off0 and pt[e - 1 + off] == rt[e - 1]:
            e -= 1
        k = j
        if off == 0:
            limit = min(len(p.hashes), len(r.hashes))
            while k < limit and p.hashes[k] == r.hashes[k]:
                k += 1
        else:
            while (k < len(r.hashes) and (k + 1) * bs + off <= len(pt)
                   and pt[k * bs + off:(k + 1) * bs + off] == rt[k * bs:(k + 1) * bs]):
                k += 1
        served = min(k, (len(pt) - 1 - off) // bs) - j
        span = max(e + off - (d + off0), e - d)
        if served < self.min_run_blocks or served * bs < span:
            return None, k
        return Realignment(d + off0, e + off, d, e, served * bs, r), k
