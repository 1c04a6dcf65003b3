"""The figures behind ``GET /cache/stats``: hit rates since start and over the last minute,
matched lengths, tree shape, pins and the dynamic-field detector's divergence points.

The one statistics pipeline of the caches: the engine calls :meth:`CacheObserver.on_admission`
once per sequence's first admission (the prefix cache's matched length) and
:meth:`on_assembly` once per chat prompt assembly; each figure is counted here once, and both
``/cache/stats`` (:meth:`snapshot`) and the Prometheus counters (:meth:`totals`, exported by
``EngineMetrics.bind_cache_figures``) read it. :meth:`snapshot` reads the KV cache manager for
the rest. Everything runs on the engine's loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hermes_async.cache.manager import KVCacheManager
from hermes_async.cache.prefix_tree import PrefixTree
from hermes_async.observe.divergence import DivergenceDetector
from hermes_async.observe.window import RollingSums

PREFIX_KEYS = ("queries", "query_tokens", "hit_tokens", "disk_hit_tokens")
ASSEMBLY_KEYS = ("queries", "hits", "partial")


class _NamespaceFigures:
    """Counters of one namespace: since start, and over the window."""

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self.prefix = dict.fromkeys(PREFIX_KEYS, 0.0)
        self.assembly = dict.fromkeys(ASSEMBLY_KEYS, 0.0)
        self.prefix_window = RollingSums(window_s, clock)
        self.assembly_window = RollingSums(window_s, clock)


class CacheObserver:
    """Per-namespace cache figures and the divergence detector of one engine."""

    def __init__(self, block_size: int, decode: Callable[[Sequence[int]], str], *,
                 window_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 detector: DivergenceDetector | None = None) -> None:
        self.block_size = block_size
        self.window_s = window_s
        self._clock = clock
        self.detector = detector or DivergenceDetector(block_size, decode, clock=clock)
        self._figures: dict[str, _NamespaceFigures] = {}

    # ----- events -----------------------------------------------------------------------------
    def on_admission(self, namespace: str, prompt_ids: Sequence[int], matched_len: int,
                     disk_tokens: int = 0) -> None:
        """A request's first admission: ``matched_len`` of its prompt came from the cache,
        ``disk_tokens`` of them loaded back from the disk tier for it."""
        f = self._for(namespace)
        values = {"queries": 1.0, "query_tokens": float(len(prompt_ids)),
                  "hit_tokens": float(matched_len), "disk_hit_tokens": float(disk_tokens)}
        _add(f.prefix, values)
        f.prefix_window.add(**values)
        self.detector.observe(namespace, prompt_ids, matched_len)

    def on_assembly(self, namespace: str, outcome: str) -> None:
        """A chat prompt assembly with its cache outcome (``hit``, ``partial`` or ``miss``)."""
        f = self._for(namespace)
        values = {"queries": 1.0, "hits": float(outcome == "hit"),
                  "partial": float(outcome == "partial")}
        _add(f.assembly, values)
        f.assembly_window.add(**values)

    def namespaces(self) -> list[str]:
        return sorted(self._figures)

    def assembly_snapshot(self) -> dict[str, Any]:
        """Only the assembly figures: ``{"totals": {...}, "namespaces": {ns: {...}}}`` (a
        process that assembles prompts for engines elsewhere: the Ray Serve ingress)."""
        tot, tot_w = dict.fromkeys(ASSEMBLY_KEYS, 0.0), dict.fromkeys(ASSEMBLY_KEYS, 0.0)
        per_ns = {}
        for ns, f in sorted(self._figures.items()):
            window = f.assembly_window.sums()
            _add(tot, f.assembly)
            _add(tot_w, window)
            per_ns[ns] = assembly_figures(f.assembly, window)
        return {"totals": assembly_figures(tot, tot_w), "namespaces": per_ns}

    def totals(self) -> dict[str, dict[str, dict[str, float]]]:
        """Per namespace, the prefix and assembly counters since start (or since its last
        reset): ``{ns: {"prefix": {...}, "assembly": {...}}}``."""
        return {ns: {"prefix": dict(f.prefix), "assembly": dict(f.assembly)}
                for ns, f in self._figures.items()}

    # ----- the /cache/stats document ----------------------------------------------------------
    def snapshot(self, cache: KVCacheManager, *, running: int, waiting: int,
                 namespaces: Iterable[str] | None = None, top: int = 10) -> dict[str, Any]:
        """The ``/cache/stats`` JSON for ``namespaces`` (default: every one seen)."""
        tree_stats = cache.tree.stats()
        names = sorted(set(self._figures) | set(tree_stats)) if namespaces is None \
            else sorted(set(namespaces))
        usage = cache.usage()
        now = cache.now()
        per_ns: dict[str, Any] = {}
        tot_prefix, tot_prefix_w = dict.fromkeys(PREFIX_KEYS, 0.0), dict.fromkeys(PREFIX_KEYS, 0.0)
        tot_asm, tot_asm_w = dict.fromkeys(ASSEMBLY_KEYS, 0.0), dict.fromkeys(ASSEMBLY_KEYS, 0.0)
        for ns in names:
            f = self._figures.get(ns) or _NamespaceFigures(self.window_s, self._clock)
            prefix_w, asm_w = f.prefix_window.sums(), f.assembly_window.sums()
            for total, part in ((tot_prefix, f.prefix), (tot_prefix_w, prefix_w),
                                (tot_asm, f.assembly), (tot_asm_w, asm_w)):
                _add(total, part)
            st = tree_stats.get(ns)
            div = self.detector.report(ns, top)
            per_ns[ns] = {
                "blocks": {"cached": (st.blocks - st.referenced_blocks) if st else 0,
                           "referenced": st.referenced_blocks if st else 0,
                           "pinned": len({nd.node_id for p in cache.pins_of(ns)
                                     for nd in p.path()})},
                **tree_shape(cache.tree, ns),
                "prefix": prefix_figures(f.prefix, prefix_w),
                "assembly": assembly_figures(f.assembly, asm_w),
                "evicted_blocks": st.evicted_blocks if st else 0,
                "pruned_blocks": st.pruned_blocks if st else 0,
                "pruned_subtrees": st.pruned_subtrees if st else 0,
                "pins": [p.to_dict(now, cache.block_size) for p in cache.pins_of(ns)],
                "short_prompts": div.short_prompts,
                "prompts_seen": div.prompts_seen,
                "prefill_tokens": div.prefill_tokens,
                "divergences": [self._point_dict(p.to_dict()) for p in div.points],
            }
        return {
            "time": time.time(),
            "block_size": cache.block_size,
            "window_s": self.window_s,
            "engine": {"running": running, "waiting": waiting},
            "blocks": {"total": usage.total, "free": usage.free, "cached": usage.cached,
                       "referenced": usage.referenced, "private": usage.private,
                       "pinned": usage.operator_pinned,
                       "used_fraction": round(usage.used_fraction, 4),
                       "active_fraction": round((usage.referenced + usage.private) / usage.total,
                                                4)},
            "totals": {"prefix": prefix_figures(tot_prefix, tot_prefix_w),
                       "assembly": assembly_figures(tot_asm, tot_asm_w)},
            "namespaces": per_ns,
            **({"disk": cache.disk_stats()} if cache.disk is not None else {}),
        }

    def _point_dict(self, point: dict[str, Any]) -> dict[str, Any]:
        """A divergence point with ``last_seen`` as Unix time and ``last_seen_ago_s``."""
        ago = max(0.0, self._clock() - point["last_seen"])
        return {**point, "last_seen": round(time.time() - ago, 3),
                "last_seen_ago_s": round(ago, 3)}

    def forget(self, namespace: str) -> None:
        """Drop a namespace's figures and divergence sample (after ``/cache/reset``)."""
        self._figures.pop(namespace, None)
        self.detector.forget(namespace)

    def _for(self, namespace: str) -> _NamespaceFigures:
        f = self._figures.get(namespace)
        if f is None:
            f = self._figures[namespace] = _NamespaceFigures(self.window_s, self._clock)
        return f


def prefix_figures(total: dict[str, float], window: dict[str, float]) -> dict[str, Any]:
    """Prefix-cache hit rates (token-weighted) and mean matched lengths; None without data."""
    def rate(d: dict[str, float], key: str = "hit_tokens") -> float | None:
        q = d.get("query_tokens", 0.0)
        return round(d.get(key, 0.0) / q, 4) if q else None

    def mean(d: dict[str, float]) -> float | None:
        n = d.get("queries", 0.0)
        return round(d.get("hit_tokens", 0.0) / n, 1) if n else None

    return {"hit_rate_1m": rate(window), "hit_rate": rate(total),
            "queries_1m": int(window.get("queries", 0)), "queries": int(total["queries"]),
            "query_tokens": int(total["query_tokens"]), "hit_tokens": int(total["hit_tokens"]),
            "mean_matched_len_1m": mean(window), "mean_matched_len": mean(total),
            "disk_hit_rate_1m": rate(window, "disk_hit_tokens"),
            "disk_hit_rate": rate(total, "disk_hit_tokens"),
            "disk_hit_tokens": int(total.get("disk_hit_tokens", 0))}


def assembly_figures(total: dict[str, float], window: dict[str, float]) -> dict[str, Any]:
    """Assembly-cache whole-hit and partial-hit rates per assembly; None without data."""
    def share(d: dict[str, float], key: str) -> float | None:
        n = d.get("queries", 0.0)
        return round(d.get(key, 0.0) / n, 4) if n else None

    return {"hit_rate_1m": share(window, "hits"), "hit_rate": share(total, "hits"),
            "partial_rate_1m": share(window, "partial"), "partial_rate": share(total, "partial"),
            "queries_1m": int(window.get("queries", 0)), "queries": int(total["queries"])}


def tree_shape(tree: PrefixTree, namespace: str) -> dict[str, Any]:
    """Nodes, depth (blocks) and fan-out (children per inner node) of one namespace's tree.

    A full walk: O(nodes of the namespace).
    """
    root = tree.roots().get(namespace)
    if root is None:
        return {"nodes": 0, "tree_depth": 0, "max_fanout": 0, "mean_fanout": 0.0,
                "root_children": 0}
    nodes = depth = max_fan = inner = children = 0
    stack = [(child, 1) for child in root.children.values()]
    while stack:
        node, d = stack.pop()
        nodes += 1
        depth = max(depth, d)
        if node.children:
            inner += 1
            children += len(node.children)
            max_fan = max(max_fan, len(node.children))
            stack.extend((c, d + 1) for c in node.children.values())
    return {"nodes": nodes, "tree_depth": depth, "max_fanout": max_fan,
            "mean_fanout": round(children / inner, 3) if inner else 0.0,
            "root_children": len(root.children)}


def _add(total: dict[str, float], part: dict[str, float]) -> None:
    for k, v in part.items():
        total[k] = total.get(k, 0.0) + v
