"""Dynamic-field detector: prompts that miss the prefix cache only because a short span differs.

The number-one cause of prefix-cache misses in production is a dynamic field (a date, timestamp
or id) in the system prompt: every request then forks the tree right there and recomputes the rest
of an otherwise identical prompt. Per namespace the detector keeps a sliding sample of the last
``sample_size`` prompts and, for each admitted request, looks for a recent prompt that lines up
with it again after the point where its cache match stopped.

Definitions (block size ``bs``, ``m = matched_len // bs``; a "block" is a full block):

* **Candidate**: a recent prompt R of the sample that equals this prompt P on blocks
  ``[0, m)`` (compared by chained block hashes), differs from it on block ``m``, and equals it
  again on some block ``j`` in ``(m, m + max_span_blocks]``: R's block ``j`` equals P's tokens
  at ``j*bs + shift`` for a shift in 0, +1, -1, +2, -2 (a field whose token count changed, e.g.
  ``9:59`` -> ``10:00``, shifts the rest of the prompt). R's blocks are compared whether or not
  R is still cached. Found with dict lookups on ``(j, hash of block j)``, newest prompt first:
  at most ``max_span_blocks * 5`` candidates per request, whatever the sample size.
* **Span**: from the first token where P and R differ (at or after ``m*bs``) to the last one
  before the realigned block (scanning back from it); it may be a single token (``5`` vs ``6``).
  ``position`` is P's index of its first token.
* **Realigned run**: the blocks ``j, j+1, ...`` of R that P repeats (at the same shift) without
  a break. **Realignment rule**: the run must hold at least ``min_run_blocks`` (default 1)
  blocks that the cache could serve to P (the tree never serves P's block holding its last
  token, so at most ``(len(P) - 1 - shift) // bs`` blocks count) and at least as many tokens as
  the span. So a genuinely different prompt (nothing equal again) and the fixed-system-prompt
  workload (the match stops at the user question; after it come at most a few template tokens,
  shorter than a block) give no divergence; a short differing span followed by a long identical
  stretch does.
* **tokens_lost** of one request: ``bs`` x the served run blocks of that rule, i.e. the whole
  blocks after the span that a block cache would have served had the span not differed (the
  blocks holding the span itself are not counted: a lower bound). A point's ``tokens_lost``
  sums it over the requests of the sample window.
* After a run breaks, the same R is searched again from the breaking block (a second dynamic
  field, e.g. a request id after a date): each realigned span is a point of its own.

Points are aggregated per namespace by position: a sighting whose span overlaps (within two
tokens) a known point's span joins it (the digits that differ between two dates vary, the field
is the same); ``position`` is then the earliest first-differing token seen. Every figure is over
the sample window: when a prompt leaves it, its contributions leave too, and a point with no
request left disappears. Prompts of at most one block are counted as ``short_prompts``: the tree
never matches the last token, so a prompt of ``n`` tokens can hit at most ``(n-1)//bs`` blocks.

When a point costs more than ``warn_share`` of the window's prefill tokens (tokens actually
computed, ``len(prompt) - matched_len`` summed), a WARNING with :data:`ADVICE` (move the field
out of the system prompt) goes to the ``hermes_async.cache`` logger, at most once per point per
``warn_interval_s``.

The search itself (candidate, span, run) is :class:`hermes_async.observe.realign.Realigner`.
Not thread-safe: call it from one thread (the engine's event loop).
"""

from __future__ import annotations

import logging
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hermes_async.observe.realign import PromptSample, Realigner

logger = logging.getLogger("hermes_async.cache")

ADVICE = ("a dynamic field (date, timestamp, user or request id) in the prompt defeats prefix "
          "caching: move it out of the system prompt and inject it later, e.g. in the last "
          "user message")

_MERGE_SLACK = 2            # tokens between two spans that still make one point
_CONTEXT_TOKENS = 24        # tokens decoded on each side of a span
_CONTEXT_CHARS = 40         # characters kept of that context
_MAX_WIDEN = 4              # tokens a span's text may grow to end on whole characters
_MAX_FIELDS_PER_REQUEST = 8
_REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class DivergencePoint:
    """One position where recent prompts fork the prefix tree and line up again after.

    ``position``: token index (in the latest request) of the first differing token, the earliest
    one seen for this field; ``block``: ``position // block_size``; ``span_tokens``: length of
    the differing span in the latest request; ``requests``: requests of the sample window that
    diverged here; ``tokens_lost``: prefill tokens they recomputed because of it (module
    docstring); ``text_before`` / ``text_after``: decoded context (about 40 characters) around
    the span; ``text_this``: the span in the latest such request; ``text_other``: the span in
    the earlier prompt it lined up with; ``last_seen``: the detector's clock at the latest one.
    """

    position: int
    block: int
    span_tokens: int
    requests: int
    tokens_lost: int
    text_before: str
    text_this: str
    text_other: str
    text_after: str
    last_seen: float

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict: every field plus ``excerpt_this`` / ``excerpt_other``
        (``...before + span + after...`` as one string each)."""
        d = asdict(self)
        d["excerpt_this"] = f"...{self.text_before}{self.text_this}{self.text_after}..."
        d["excerpt_other"] = f"...{self.text_before}{self.text_other}{self.text_after}..."
        return d


@dataclass(frozen=True)
class NamespaceDivergence:
    """The detector's report on one namespace, over its sample window.

    ``prompts_seen``: prompts in the window; ``prefill_tokens``: tokens they computed
    (``len - matched_len``); ``short_prompts``: those of at most one block (never a hit);
    ``points``: sorted by ``tokens_lost`` descending, the top ones; ``prompt_tokens``: all their
    tokens; ``observed_total``: prompts observed since start (or ``forget``).
    """

    namespace: str
    prompts_seen: int
    prefill_tokens: int
    short_prompts: int
    block_size: int
    points: list[DivergencePoint]
    prompt_tokens: int = 0
    observed_total: int = 0

    def share(self, point: DivergencePoint) -> float:
        """``point.tokens_lost`` as a share of the window's prefill tokens."""
        return point.tokens_lost / self.prefill_tokens if self.prefill_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; each point also carries ``share_of_prefill``."""
        d = {k: v for k, v in asdict(self).items() if k != "points"}
        d["points"] = [{**p.to_dict(), "share_of_prefill": round(self.share(p), 4)}
                       for p in self.points]
        return d


class _Sample(PromptSample):
    """A prompt of the window plus what it added to the sums and points (taken back when it
    leaves the window)."""

    __slots__ = ("prefill", "short", "hits")

    def __init__(self, token_ids: Sequence[int], block_size: int, matched_len: int) -> None:
        super().__init__(token_ids, block_size)
        self.prefill = len(self.tokens) - matched_len
        self.short = len(self.tokens) <= block_size
        self.hits: list[tuple[_Point, int]] = []


@dataclass(slots=True)
class _Sighting:
    """The latest request of a point: both prompts and the span's bounds in each."""

    this: array
    other: array
    this_span: tuple[int, int]
    other_span: tuple[int, int]


@dataclass(slots=True, eq=False)
class _Point:
    """Mutable aggregate behind a :class:`DivergencePoint`."""

    start: int
    end: int
    latest: _Sighting
    requests: int = 0
    tokens_lost: int = 0
    last_seen: float = 0.0
    warned_at: float | None = None
    live: bool = True


@dataclass
class _Namespace:
    """State of one namespace: the window ring, the block index, the points and the sums."""

    ring: deque[_Sample] = field(default_factory=deque)
    index: dict[int, PromptSample] = field(default_factory=dict)  # index_key -> newest
    points: set[_Point] = field(default_factory=set)            # live points (identity)
    by_block: dict[int, list[_Point]] = field(default_factory=dict)
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    short_prompts: int = 0
    observed_total: int = 0


class DivergenceDetector:
    """Finds dynamic fields that fork the prefix tree; see the module docstring for the rules.

    ``decode`` turns token ids into text (e.g. ``tokenizer.decode``); it is only called for
    requests that diverge. ``candidate_checks`` counts candidate prompts examined (at most
    ``max_span_blocks * 5`` per observed request, independent of ``sample_size``).
    """

    def __init__(self, block_size: int, decode: Callable[[Sequence[int]], str], *,
                 sample_size: int = 256, max_span_blocks: int = 4, warn_share: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, max_points: int = 64,
                 warn_interval_s: float = 600.0, warn_min_requests: int = 2,
                 min_run_blocks: int = 1) -> None:
        if block_size < 1 or sample_size < 1 or max_span_blocks < 1 or max_points < 1:
            raise ValueError("block_size, sample_size, max_span_blocks and max_points must be "
                             "at least 1")
        if not 0.0 <= warn_share <= 1.0 or min_run_blocks < 1:
            raise ValueError("warn_share must be in [0, 1] and min_run_blocks at least 1")
        self.block_size = block_size
        self.decode = decode
        self.sample_size = sample_size
        self.max_span_blocks = max_span_blocks
        self.warn_share = warn_share
        self.warn_interval_s = warn_interval_s
        self.warn_min_requests = warn_min_requests
        self.min_run_blocks = min_run_blocks
        self.max_points = max_points
        self.clock = clock
        self._realigner = Realigner(block_size, max_span_blocks, min_run_blocks)
        self._ns: dict[str, _Namespace] = {}

    @property
    def candidate_checks(self) -> int:
        """Candidate prompts examined so far (at most ``max_span_blocks * 5`` per request)."""
        return self._realigner.checks

    # ----- public API -------------------------------------------------------------------------
    def observe(self, namespace: str, token_ids: Sequence[int],
                matched_len: int) -> DivergencePoint | None:
        """Record one admitted request whose prefix-cache match was ``matched_len`` tokens.

        Cost: hashing the prompt's blocks, O(blocks) dict operations, and at most
        ``max_span_blocks * 5`` candidate comparisons (token-level only around a found span).
        Returns the point this request diverged at (its first one), or None.
        """
        ns = self._ns.get(namespace)
        if ns is None:
            ns = self._ns[namespace] = _Namespace()
        sample = _Sample(token_ids, self.block_size, matched_len)
        found = self._realigner.find(ns.index, sample, matched_len // self.block_size,
                                     _MAX_FIELDS_PER_REQUEST)
        self._admit(ns, sample)
        now = self.clock()
        hits: dict[_Point, int] = {}  # two spans of one request may join one point
        for f in found:
            pt = self._point_for(ns, f.start, f.end)
            pt.latest = _Sighting(sample.tokens, f.other.tokens, (f.start, f.end),
                                  (f.other_start, f.other_end))
            hits[pt] = hits.get(pt, 0) + f.tokens_lost
        for pt, lost in hits.items():
            pt.requests += 1
            pt.tokens_lost += lost
            pt.last_seen = now
        sample.hits = list(hits.items())
        for pt in hits:
            self._maybe_warn(namespace, ns, pt, now)
        first = next(iter(hits), None)
        return self._snapshot(first) if first is not None else None

    def report(self, namespace: str, top: int = 10) -> NamespaceDivergence:
        """The namespace's window figures and its ``top`` points by ``tokens_lost``."""
        ns = self._ns.get(namespace) or _Namespace()
        pts = sorted(ns.points, key=lambda p: (-p.tokens_lost, -p.requests, p.start))
        return NamespaceDivergence(
            namespace, len(ns.ring), ns.prefill_tokens, ns.short_prompts, self.block_size,
            [self._snapshot(p) for p in pts[:max(top, 0)]], ns.prompt_tokens, ns.observed_total)

    def namespaces(self) -> list[str]:
        """Namespaces with a sample, sorted."""
        return sorted(self._ns)

    def forget(self, namespace: str | None = None) -> None:
        """Drop one namespace's sample and points (all namespaces when None)."""
        if namespace is None:
            self._ns.clear()
        else:
            self._ns.pop(namespace, None)

    # ----- window bookkeeping -----------------------------------------------------------------
    def _admit(self, ns: _Namespace, s: _Sample) -> None:
        while len(ns.ring) >= self.sample_size:
            self._retire(ns, ns.ring.popleft())
        ns.ring.append(s)
        for key in s.index_keys():
            ns.index[key] = s
        ns.prompt_tokens += len(s.tokens)
        ns.prefill_tokens += s.prefill
        ns.short_prompts += s.short
        ns.observed_total += 1

    def _retire(self, ns: _Namespace, s: _Sample) -> None:
        for key in s.index_keys():
            if ns.index.get(key) is s:
                del ns.index[key]
        ns.prompt_tokens -= len(s.tokens)
        ns.prefill_tokens -= s.prefill
        ns.short_prompts -= s.short
        for pt, lost in s.hits:
            if pt.live:
                pt.requests -= 1
                pt.tokens_lost -= lost
                if pt.requests <= 0:
                    self._drop_point(ns, pt)
        s.hits.clear()

    def _blocks(self, start: int, end: int) -> range:
        return range(start // self.block_size, max(end - 1, start) // self.block_size + 1)

    def _point_for(self, ns: _Namespace, start: int, end: int) -> _Point:
        """The point whose span overlaps ``[start, end)`` (within the slack), else a new one."""
        end = max(end, start + 1)
        limit = (self.max_span_blocks + 1) * self.block_size
        for b in self._blocks(max(start - _MERGE_SLACK, 0), end + _MERGE_SLACK):
            for pt in ns.by_block.get(b, ()):
                if (start < pt.end + _MERGE_SLACK and pt.start < end + _MERGE_SLACK
                        and max(end, pt.end) - min(start, pt.start) <= limit):
                    old = set(self._blocks(pt.start, pt.end))
                    pt.start, pt.end = min(start, pt.start), max(end, pt.end)
                    for nb in self._blocks(pt.start, pt.end):
                        if nb not in old:
                            ns.by_block.setdefault(nb, []).append(pt)
                    return pt
        if len(ns.points) >= self.max_points:
            victim = min(ns.points, key=lambda p: (p.tokens_lost, p.last_seen))
            self._drop_point(ns, victim)
        empty = array("i")
        pt = _Point(start, end, _Sighting(empty, empty, (0, 0), (0, 0)))
        ns.points.add(pt)
        for b in self._blocks(start, end):
            ns.by_block.setdefault(b, []).append(pt)
        return pt

    def _drop_point(self, ns: _Namespace, pt: _Point) -> None:
        pt.live = False
        ns.points.discard(pt)
        for b in self._blocks(pt.start, pt.end):
            lst = ns.by_block.get(b)
            if lst is not None and pt in lst:
                lst.remove(pt)
                if not lst:
                    del ns.by_block[b]

    # ----- output -----------------------------------------------------------------------------
    def _maybe_warn(self, namespace: str, ns: _Namespace, pt: _Point, now: float) -> None:
        if not pt.live or ns.prefill_tokens <= 0 or pt.requests < self.warn_min_requests:
            return
        share = pt.tokens_lost / ns.prefill_tokens
        if share <= self.warn_share:
            return
        if pt.warned_at is not None and now - pt.warned_at < self.warn_interval_s:
            return
        pt.warned_at = now
        snap = self._snapshot(pt)
        logger.warning(
            "prefix cache, namespace %r: prompts fork at token %d (block %d) and line up again "
            "after it: %d of the last %d requests, %d prefill tokens recomputed (%.0f%% of "
            "prefill); %r vs %r in ...%s[...]%s...; %s",
            namespace, snap.position, snap.block, snap.requests, len(ns.ring), snap.tokens_lost,
            100 * share, snap.text_this, snap.text_other, snap.text_before, snap.text_after,
            ADVICE)

    def _snapshot(self, pt: _Point) -> DivergencePoint:
        s = pt.latest
        before, this, other, after = span_texts(self.decode, s.this, s.other, s.this_span,
                                                s.other_span)
        return DivergencePoint(pt.start, pt.start // self.block_size,
                               s.this_span[1] - s.this_span[0], pt.requests, pt.tokens_lost,
                               before, this, other, after, pt.last_seen)


def span_texts(decode: Callable[[Sequence[int]], str], this: Sequence[int],
               other: Sequence[int], this_span: tuple[int, int],
               other_span: tuple[int, int]) -> tuple[str, str, str, str]:
    """``(before, this, other, after)`` texts of a span differing between two prompts.

    The context before/after is taken from ``this`` (it equals ``other`` there). Byte-level
    tokenizers can split a character across tokens: the spans grow (by equal tokens on both
    sides, at most a few) until both decode to whole characters, and cut-off characters at the
    outer edges of the context are dropped.
    """
    (a, b), (c, d) = this_span, other_span

    def clean(x: int, y: int, u: int, v: int) -> tuple[str, str]:
        return decode(list(this[x:y])), decode(list(other[u:v]))

    t, o = clean(a, b, c, d)
    for _ in range(_MAX_WIDEN):
        grow_l = a > 0 and c > 0 and (t.startswith(_REPLACEMENT) or o.startswith(_REPLACEMENT))
        grow_r = (b < len(this) and d < len(other)
                  and (t.endswith(_REPLACEMENT) or o.endswith(_REPLACEMENT)))
        if not grow_l and not grow_r:
            break
        a, c = (a - 1, c - 1) if grow_l else (a, c)
        b, d = (b + 1, d + 1) if grow_r else (b, d)
        t, o = clean(a, b, c, d)
    before = decode(list(this[max(a - _CONTEXT_TOKENS, 0):a])).lstrip(_REPLACEMENT)
    after = decode(list(this[b:b + _CONTEXT_TOKENS])).rstrip(_REPLACEMENT)
    return before[-_CONTEXT_CHARS:], t, o, after[:_CONTEXT_CHARS]

