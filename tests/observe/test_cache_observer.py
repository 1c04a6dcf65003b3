"""The one statistics pipeline: figures counted once by the observer, read by /cache/stats and
by the Prometheus counters alike."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from hermes_async.cache.manager import KVCacheManager
from hermes_async.metrics import EngineMetrics
from hermes_async.observe.cache_observer import CacheObserver


def samples(metrics: EngineMetrics) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            if "namespace" in s.labels:
                out[(s.name, s.labels["namespace"])] = s.value
    return out


def test_prefix_and_assembly_figures_feed_stats_and_metrics_from_one_count() -> None:
    observer = CacheObserver(4, lambda ids: " ".join(map(str, ids)))
    metrics = EngineMetrics()
    metrics.bind_cache_figures(observer.totals)
    observer.on_admission("ns", list(range(10)), 8)  # 10 tokens, 8 hit
    observer.on_admission("ns", list(range(100, 106)), 0)  # 6 tokens, 0 hit
    for outcome in ("hit", "partial", "miss", "hit"):
        observer.on_assembly("ns", outcome)
    doc = observer.snapshot(KVCacheManager(16, 4), running=0, waiting=0)
    prefix, assembly = doc["namespaces"]["ns"]["prefix"], doc["namespaces"]["ns"]["assembly"]
    assert (prefix["queries"], prefix["query_tokens"], prefix["hit_tokens"]) == (2, 16, 8)
    assert prefix["hit_rate"] == 0.5 and prefix["mean_matched_len"] == 4.0
    assert (assembly["queries"], assembly["hit_rate"], assembly["partial_rate"]) == (4, 0.5, 0.25)
    got = samples(metrics)
    assert got[("hermes_prefix_cache_queries_total", "ns")] == 16
    assert got[("hermes_prefix_cache_hits_total", "ns")] == 8
    assert got[("hermes_assembly_cache_queries_total", "ns")] == 4
    assert got[("hermes_assembly_cache_hits_total", "ns")] == 2
    assert got[("hermes_assembly_cache_partial_hits_total", "ns")] == 1


def test_forget_drops_a_namespace_from_both() -> None:
    observer = CacheObserver(4, str)
    metrics = EngineMetrics()
    metrics.bind_cache_figures(observer.totals)
    observer.on_admission("a", [1, 2, 3, 4], 4)
    observer.on_admission("b", [1, 2, 3, 4], 0)
    observer.forget("a")
    assert observer.namespaces() == ["b"]
    assert {ns for _, ns in samples(metrics)} == {"b"}
