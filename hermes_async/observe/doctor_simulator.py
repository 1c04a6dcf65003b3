"""The prompt doctor's statistics and block-cache simulator.

Per prompt, in file order: the longest common token prefix with any earlier prompt of its
namespace, and what a block cache would serve (a real
:class:`~hermes_async.cache.prefix_tree.PrefixTree` of the block size, no eviction: match, then
insert the prompt's full blocks); the reusable share is served tokens / prompt tokens. The
simulated matches feed a :class:`~hermes_async.observe.divergence.DivergenceDetector` (the
whole file as its sample window) to find dynamic fields; prompts of at most one block (never a
hit) are listed.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from hermes_async.cache.prefix_tree import PrefixTree
from hermes_async.observe.divergence import DivergenceDetector, DivergencePoint
from hermes_async.observe.doctor_reader import CapturedPrompt


@dataclass(frozen=True)
class Distribution:
    """Nearest-rank percentiles of per-prompt token counts."""

    p50: int
    p90: int
    max: int
    mean: float

    @classmethod
    def of(cls, values: Sequence[int]) -> Distribution:
        if not values:
            return cls(0, 0, 0, 0.0)
        v = sorted(values)

        def rank(q: float) -> int:
            return v[max(math.ceil(q * len(v)) - 1, 0)]

        return cls(rank(0.5), rank(0.9), v[-1], round(sum(v) / len(v), 1))


@dataclass
class NamespaceFigures:
    """Per-namespace figures: prompts, tokens, block-cache served tokens, short prompts."""

    prompts: int = 0
    tokens: int = 0
    served_tokens: int = 0
    short_prompts: int = 0

    @property
    def reusable_share(self) -> float:
        return self.served_tokens / self.tokens if self.tokens else 0.0


@dataclass(frozen=True)
class ReuseFigures:
    """What the simulated block cache found over a whole file.

    ``divergence``: ``(namespace, point, share of the namespace's prefill)``, most tokens lost
    first; a point's ``last_seen`` is the line number of its latest request.
    """

    tokens: int
    served_tokens: int
    shared_prefix: Distribution
    served: Distribution
    short_prompt_lines: list[int]
    divergence: list[tuple[str, DivergencePoint, float]]
    namespaces: dict[str, NamespaceFigures]

    @property
    def reusable_share(self) -> float:
        """Served tokens / prompt tokens at the block size (0 without prompts)."""
        return self.served_tokens / self.tokens if self.tokens else 0.0


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (binary search over C-speed slice comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class CacheSimulator:
    """The block cache of one file (one tree, a namespace per group) and the sorted earlier
    prompts per namespace: the longest common prefix with any earlier prompt is with a
    neighbour in lexicographic order. The detector's clock is the line of the prompt fed."""

    def __init__(self, block_size: int, decode: Callable[[Sequence[int]], str], *,
                 sample_size: int, max_points: int) -> None:
        self.tree = PrefixTree(block_size)
        self.line = 0
        self.detector = DivergenceDetector(block_size, decode, sample_size=sample_size,
                                           warn_share=1.0, max_points=max_points,
                                           clock=lambda: float(self.line))
        self._blocks = itertools.count()
        self._sorted: dict[str, list[tuple[int, ...]]] = defaultdict(list)

    def feed(self, p: CapturedPrompt) -> tuple[int, int]:
        """``(shared prefix, served tokens)`` of ``p``; then ``p`` joins the cache."""
        self.line = p.line
        ids, bs = p.token_ids, self.tree.block_size
        seen = self._sorted[p.namespace]
        i = bisect.bisect_left(seen, ids)
        shared = max((common_prefix_len(ids, seen[k]) for k in (i - 1, i) if 0 <= k < len(seen)),
                     default=0)
        seen.insert(i, ids)
        match = self.tree.match(p.namespace, ids)
        self.detector.observe(p.namespace, ids, match.matched_len)
        full = len(ids) // bs
        self.tree.insert(p.namespace, ids[match.matched_len:full * bs],
                         [next(self._blocks) for _ in range(full - match.matched_len // bs)],
                         parent=match.last_node)
        return shared, match.matched_len

    def divergence(self, top: int) -> list[tuple[str, DivergencePoint, float]]:
        """The ``top`` dynamic fields of every namespace, most tokens lost first."""
        points = []
        for ns in self.detector.namespaces():
            rep = self.detector.report(ns, top)
            points += [(ns, pt, rep.share(pt)) for pt in rep.points]
        points.sort(key=lambda d: -d[1].tokens_lost)
        return points[:top]


def simulate(prompts: Iterable[CapturedPrompt], *, block_size: int,
             decode: Callable[[Sequence[int]], str], top: int = 10) -> ReuseFigures:
    """Feed ``prompts`` (file order) through a :class:`CacheSimulator`; the figures."""
    prompts = list(prompts)
    sim = CacheSimulator(block_size, decode, sample_size=max(len(prompts), 1),
                         max_points=max(4 * top, 64))
    shared, served = [], []
    per_ns: dict[str, NamespaceFigures] = defaultdict(NamespaceFigures)
    for p in prompts:
        s, m = sim.feed(p)
        shared.append(s)
        served.append(m)
        figures = per_ns[p.namespace]
        figures.prompts += 1
        figures.tokens += len(p.token_ids)
        figures.served_tokens += m
        figures.short_prompts += len(p.token_ids) <= block_size
    return ReuseFigures(
        tokens=sum(len(p.token_ids) for p in prompts), served_tokens=sum(served),
        shared_prefix=Distribution.of(shared), served=Distribution.of(served),
        short_prompt_lines=[p.line for p in prompts if len(p.token_ids) <= block_size],
        divergence=sim.divergence(top),
        namespaces=dict(sorted(per_ns.items())))
