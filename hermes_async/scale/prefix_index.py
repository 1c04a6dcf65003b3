"""Prefix-cache-aware routing, without Ray: a shadow of what each replica has cached, and the
choice of a replica for a request.

The ingress tokenizes a request before routing, so the router sees ``(namespace, token ids)``.
``cache/digest.py`` ``block_hashes`` chains a hash over each full block of ``block_size`` tokens
(the engines' block size), seeded with the namespace: tenants never match each other.
:class:`ShadowIndex` keeps, per replica and namespace, the block hashes it routed there (LRU order,
like the replicas' own eviction), and is corrected by what replicas report
(:meth:`ShadowIndex.correct`: a restart or a cache reset drops the shadow, fewer cached blocks than
shadowed trims its oldest entries). :func:`rank_replicas` sends a request to the replica with the
longest shadowed prefix unless that replica's load exceeds the least loaded one's by more than
``margin``; then to the least loaded. Pure and synchronous: the Ray router calls it without
blocking.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class ReplicaShadow:
    """What the router believes one replica holds: namespace -> block digests (LRU order)."""

    namespaces: dict[str, OrderedDict[bytes, None]] = field(default_factory=dict)
    started_at: float | None = None
    resets: dict[str, int] = field(default_factory=dict)
    touched: dict[str, float] = field(default_factory=dict)  # namespace -> last routed (time)


@dataclass(frozen=True)
class ReplicaReport:
    """A replica's routing stats: when its engine started, cached blocks per namespace, a
    reset counter per namespace (``/cache/reset``) and when it was taken (``taken_at``, Unix
    time; a report is older than what was routed since)."""

    started_at: float
    cached_blocks: Mapping[str, int]
    resets: Mapping[str, int]
    taken_at: float = float("inf")

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> ReplicaReport | None:
        try:
            return cls(float(d["started_at"]),  # type: ignore[arg-type]
                       dict(d.get("cached_blocks") or {}),  # type: ignore[call-overload]
                       dict(d.get("resets") or {}),  # type: ignore[call-overload]
                       float(d.get("taken_at", float("inf"))))  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError):
            return None


class ShadowIndex:
    """Per replica, per namespace, the block digests routed there (see the module doc).

    max_blocks: most digests kept per replica and namespace (oldest dropped first).
    clock: Unix time (``time.time``: replicas stamp their reports with it). ``skew_s``: how
    far a replica's clock may be ahead of the router's.
    """

    def __init__(self, max_blocks: int = 200_000,
                 clock: Callable[[], float] = time.time, skew_s: float = 1.0) -> None:
        self.max_blocks = max_blocks
        self.clock = clock
        self.skew_s = skew_s
        self._replicas: dict[str, ReplicaShadow] = {}

    def replicas(self) -> list[str]:
        return list(self._replicas)

    def size(self, replica: str) -> int:
        """Digests shadowed for ``replica`` over every namespace (how full it is believed)."""
        shadow = self._replicas.get(replica)
        return sum(len(b) for b in shadow.namespaces.values()) if shadow else 0

    def matched_blocks(self, replica: str, namespace: str, hashes: Sequence[bytes]) -> int:
        """Leading blocks of ``hashes`` the replica is believed to hold."""
        shadow = self._replicas.get(replica)
        blocks = shadow.namespaces.get(namespace) if shadow else None
        if not blocks:
            return 0
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def record(self, replica: str, namespace: str, hashes: Sequence[bytes]) -> None:
        """A request with these blocks was routed to ``replica``: it will hold them."""
        shadow = self._replicas.setdefault(replica, ReplicaShadow())
        shadow.touched[namespace] = self.clock()
        blocks = shadow.namespaces.setdefault(namespace, OrderedDict())
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def forget(self, replica: str) -> None:
        """The replica is gone (removed, or died: its cache with it)."""
        self._replicas.pop(replica, None)

    def correct(self, replica: str, report: ReplicaReport) -> None:
        """Apply a replica's report: a new ``started_at`` (restart) drops everything; a reset
        counter that moved drops that namespace; more shadowed blocks than the replica holds
        drops the oldest (it evicts least recently used first, as the shadow is ordered) --
        except in a namespace routed to since the report was taken (the replica had not
        prefilled those blocks yet)."""
        shadow = self._replicas.setdefault(replica, ReplicaShadow())
        if shadow.started_at is not None and shadow.started_at != report.started_at:
            shadow.namespaces.clear()
            shadow.resets.clear()
        shadow.started_at = report.started_at
        for ns, count in report.resets.items():
            if shadow.resets.get(ns, count) != count:
                shadow.namespaces.pop(ns, None)
            shadow.resets[ns] = count
        for ns, blocks in list(shadow.namespaces.items()):
            if shadow.touched.get(ns, float("-inf")) >= report.taken_at - self.skew_s:
                continue
            keep = report.cached_blocks.get(ns, 0)
            while len(blocks) > keep:
                blocks.popitem(last=False)
            if not blocks:
                del shadow.namespaces[ns]
                shadow.touched.pop(ns, None)


@dataclass(frozen=True)
class Choice:
    """Where a request goes and why (``reason``: ``prefix``, ``load`` or ``spill``)."""

    ranking: list[str]
    reason: str
    matched_blocks: int


def rank_replicas(index: ShadowIndex, namespace: str, hashes: Sequence[bytes],
                  loads: Mapping[str, int], margin: int,
                  min_matched_fraction: float = 0.0) -> Choice:
    """Rank the replicas of ``loads`` (replica -> requests in flight) for a request.

    "By load" means fewest requests in flight, then fewest shadowed blocks (a new prefix goes
    where the cache is emptiest, so idle replicas share new tenants), then by name.

    The replica with the longest shadowed prefix first (ties: the least loaded, then by name),
    unless its load exceeds the least loaded replica's by more than ``margin``: then the least
    loaded first (``spill``). With no prefix anywhere, or none covering at least
    ``min_matched_fraction`` of the prompt's full blocks (every chat prompt shares its first
    template tokens; a short shared head is not worth piling requests on one replica): the
    least loaded (``load``). The rest follow by load.
    """
    if not loads:
        return Choice([], "load", 0)
    by_load = sorted(loads, key=lambda r: (loads[r], index.size(r), r))
    least = by_load[0]
    scored = {r: index.matched_blocks(r, namespace, hashes) for r in loads}
    best = max(loads, key=lambda r: (scored[r], -loads[r], _neg(r)))
    if scored[best] == 0 or scored[best] < min_matched_fraction * len(hashes):
        return Choice(by_load, "load", scored[best])
    if loads[best] - loads[least] > margin:
        return Choice(by_load, "spill", scored[least])
    return Choice([best] + [r for r in by_load if r != best], "prefix", scored[best])


def _neg(name: str) -> tuple[int, ...]:
    """Sort key making smaller names win ties under ``max``."""
    return tuple(-ord(c) for c in name)
