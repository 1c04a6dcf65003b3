"""Per-replica figures made into one answer: ``/metrics`` and ``/cache/stats`` behind Ray.

:func:`merge_metrics` relabels every sample of each replica's Prometheus text with
``replica="<name>"`` (the ingress's own with ``replica="ingress"``) and writes one exposition
with each metric family once. :func:`merge_cache_stats` keeps each replica's ``/cache/stats``
document under ``replicas`` and sums the counts into the single-engine shape (block counts,
queue lengths, per-namespace figures), recomputing the rates from the summed counts; the
assembly figures are the ingress's own (it assembles every prompt).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from hermes_async.observe.cache_observer import assembly_figures, prefix_figures

INGRESS = "ingress"


class _Families:
    """A collector yielding already-built metric families."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def merge_metrics(texts: Mapping[str, bytes]) -> bytes:
    """One Prometheus exposition of ``texts`` (replica name -> its exposition)."""
    merged: dict[str, Metric] = {}
    for replica, text in texts.items():
        for family in text_string_to_metric_families(text.decode()):
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation,
                                                    family.type, family.unit)
            into.samples.extend(
                Sample(s.name, {**s.labels, "replica": replica}, s.value, s.timestamp,
                       s.exemplar) for s in family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(merged.values())))  # type: ignore[arg-type]
    return generate_latest(registry)


def _sum_into(total: dict[str, Any], part: Mapping[str, Any], keys: tuple[str, ...]) -> None:
    for k in keys:
        value = part.get(k)
        if isinstance(value, int | float) and not isinstance(value, bool):
            total[k] = total.get(k, 0) + value


_BLOCK_KEYS = ("total", "free", "cached", "referenced", "private", "pinned")
_NS_BLOCK_KEYS = ("cached", "referenced", "pinned")
_NS_KEYS = ("evicted_blocks", "pruned_blocks", "pruned_subtrees", "short_prompts",
            "prompts_seen", "prefill_tokens")


def _prefix(parts: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Summed prefix figures (since start: exact; the 1-minute window: queries only)."""
    keys = ("queries", "query_tokens", "hit_tokens", "disk_hit_tokens")
    total = dict.fromkeys(keys, 0.0)
    for p in parts:
        _sum_into(total, p, keys)
    window = {"queries": sum(p.get("queries_1m") or 0 for p in parts)}
    out = prefix_figures(total, window)
    for key in ("hit_rate_1m", "mean_matched_len_1m", "disk_hit_rate_1m"):
        out[key] = _mean_rate(parts, key, "queries_1m")
    return out


_DISK_SUMS = ("written_blocks", "written_bytes", "removed_blocks", "dropped_blocks",
              "backlog_blocks", "backlog_bytes", "loads", "loaded_blocks", "loaded_bytes",
              "load_seconds", "missing_files", "corrupt_files", "write_errors", "hit_requests",
              "hit_tokens", "loading")


def merge_disk(figures: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The replicas' disk tiers: counters summed; ``blocks``/``bytes`` of the largest view
    (replicas on one directory see the same files); enabled only if every tier is."""
    if not figures:
        return None
    out: dict[str, Any] = {}
    for f in figures:
        _sum_into(out, f, _DISK_SUMS)
    for key in ("blocks", "bytes", "max_bytes"):
        out[key] = max(f.get(key, 0) for f in figures)
    out["enabled"] = all(f.get("enabled", False) for f in figures)
    out["reason"] = "; ".join(sorted({f["reason"] for f in figures if f.get("reason")}))
    out["dirs"] = sorted({f.get("dir", "") for f in figures})
    return out


def _mean_rate(parts: list[Mapping[str, Any]], key: str, weight: str) -> float | None:
    """``key`` averaged over ``parts`` weighted by ``weight``; None without data."""
    num = den = 0.0
    for p in parts:
        value, w = p.get(key), p.get(weight) or 0
        if value is not None and w:
            num, den = num + value * w, den + w
    return round(num / den, 4) if den else None


def merge_speculative(figures: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The replicas' speculative-decoding figures summed, rates recomputed from the sums
    (None when no replica speculates)."""
    if not figures:
        return None
    out: dict[str, Any] = {"method": figures[0].get("method")}
    for key in ("drafts", "draft_tokens", "accepted_tokens"):
        out[key] = sum(f.get(key, 0) for f in figures)
    out["acceptance_rate"] = (out["accepted_tokens"] / out["draft_tokens"]
                              if out["draft_tokens"] else 0.0)
    out["mean_accepted_length"] = (out["accepted_tokens"] / out["drafts"]
                                   if out["drafts"] else 0.0)
    return out


def merge_cache_stats(docs: Mapping[str, Mapping[str, Any]],
                      assembly: Mapping[str, Any]) -> dict[str, Any]:
    """One ``/cache/stats`` document of ``docs`` (replica name -> its document); the assembly
    figures are the ingress's (``CacheObserver.assembly_snapshot``): it assembles prompts."""
    blocks: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    namespaces: dict[str, dict[str, Any]] = {}
    per_ns_prefix: dict[str, list[Mapping[str, Any]]] = {}
    for doc in docs.values():
        _sum_into(blocks, doc.get("blocks", {}), _BLOCK_KEYS)
        _sum_into(engine, doc.get("engine", {}), ("running", "waiting"))
        for ns, fig in doc.get("namespaces", {}).items():
            into = namespaces.setdefault(ns, {"blocks": {}})
            _sum_into(into["blocks"], fig.get("blocks", {}), _NS_BLOCK_KEYS)
            _sum_into(into, fig, _NS_KEYS)
            per_ns_prefix.setdefault(ns, []).append(fig.get("prefix", {}))
    for ns, into in namespaces.items():
        into["prefix"] = _prefix(per_ns_prefix[ns])
    asm_ns = assembly.get("namespaces", {})
    for ns in set(namespaces) | set(asm_ns):
        into = namespaces.setdefault(ns, {"blocks": {}, "prefix": _prefix([])})
        into["assembly"] = asm_ns.get(ns) or assembly_figures({"queries": 0.0}, {})
    if blocks.get("total"):
        used = blocks["total"] - blocks.get("free", 0)
        blocks["used_fraction"] = round(used / blocks["total"], 4)
    first = next(iter(docs.values()), {})
    speculative = merge_speculative([d["speculative"] for d in docs.values()
                                     if "speculative" in d])
    extra = {"speculative": speculative} if speculative is not None else {}
    disk = merge_disk([d["disk"] for d in docs.values() if "disk" in d])
    if disk is not None:
        extra["disk"] = disk
    return {**extra,
        "time": max((d.get("time", 0) for d in docs.values()), default=0),
        "block_size": first.get("block_size"), "window_s": first.get("window_s"),
        "engine": engine, "blocks": blocks,
        "totals": {"prefix": _prefix([d.get("totals", {}).get("prefix", {})
                                      for d in docs.values()]),
                   "assembly": assembly.get("totals")},
        "namespaces": namespaces,
        "replicas": dict(docs),
    }
