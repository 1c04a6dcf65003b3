"""Per-replica figures into one answer (no Ray): /metrics relabelled by replica with each
family once, /cache/stats summed with rates recomputed from the summed counts; refusals
rebuilt as the engine's exceptions."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hermes_async.engine.errors import NamespaceBusyError, QueueFullError
from hermes_async.scale.merge import merge_cache_stats, merge_metrics
from hermes_async.scale.messages import Refused
from hermes_async.types import InvalidParameter


def exposition(blocks: float, errors: float) -> bytes:
    registry = CollectorRegistry()
    Gauge("hermes_kv_blocks_total", "KV pool blocks", registry=registry).set(blocks)
    Counter("hermes_request_errors", "Failed requests by code", ["code"],
            registry=registry).labels("queue_full").inc(errors)
    return generate_latest(registry)


def test_metrics_are_relabelled_and_each_family_appears_once() -> None:
    text = merge_metrics({"a": exposition(10, 1), "b": exposition(20, 2)}).decode()
    assert text.count("# TYPE hermes_kv_blocks_total gauge") == 1
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("hermes_kv_blocks_total", (("replica", "a"),))] == 10
    assert samples[("hermes_kv_blocks_total", (("replica", "b"),))] == 20
    assert samples[("hermes_request_errors_total",
                    (("code", "queue_full"), ("replica", "b")))] == 2


def stats(total: int, free: int, ns: str, queries: int, query_tokens: int,
          hit_tokens: int) -> dict:
    prefix = {"queries": queries, "query_tokens": query_tokens, "hit_tokens": hit_tokens,
              "queries_1m": queries, "hit_rate_1m": hit_tokens / query_tokens,
              "mean_matched_len_1m": hit_tokens / queries}
    return {"time": 1.0, "block_size": 16, "window_s": 60,
            "engine": {"running": 1, "waiting": 2},
            "blocks": {"total": total, "free": free, "cached": total - free, "referenced": 0,
                       "private": 0, "pinned": 0},
            "totals": {"prefix": prefix},
            "namespaces": {ns: {"blocks": {"cached": 3, "referenced": 0, "pinned": 0},
                                "prefix": prefix, "evicted_blocks": 1}}}


def test_cache_stats_are_summed_and_rates_recomputed() -> None:
    a = stats(100, 50, "t1", queries=2, query_tokens=100, hit_tokens=50)
    b = stats(100, 100, "t1", queries=2, query_tokens=300, hit_tokens=0)
    assembly = {"totals": {"queries": 4}, "namespaces": {"t1": {"queries": 4}}}
    doc = merge_cache_stats({"a": a, "b": b}, assembly)
    assert doc["blocks"]["total"] == 200 and doc["blocks"]["used_fraction"] == 0.25
    assert doc["engine"] == {"running": 2, "waiting": 4}
    assert doc["totals"]["prefix"]["hit_rate"] == 0.125  # 50 of 400 tokens, not (0.5 + 0)/2
    t1 = doc["namespaces"]["t1"]
    assert t1["blocks"]["cached"] == 6 and t1["evicted_blocks"] == 2
    assert t1["assembly"] == {"queries": 4}
    assert set(doc["replicas"]) == {"a", "b"}
    assert "speculative" not in doc  # no replica speculates


def test_speculative_figures_are_summed_and_rates_recomputed() -> None:
    a = stats(100, 50, "t1", queries=1, query_tokens=10, hit_tokens=0)
    b = stats(100, 50, "t1", queries=1, query_tokens=10, hit_tokens=0)
    a["speculative"] = {"method": "suffix", "drafts": 10, "draft_tokens": 40,
                        "accepted_tokens": 30, "acceptance_rate": 0.75}
    b["speculative"] = {"method": "suffix", "drafts": 30, "draft_tokens": 60,
                        "accepted_tokens": 10, "acceptance_rate": 1 / 6}
    spec = merge_cache_stats({"a": a, "b": b}, {})["speculative"]
    assert spec["draft_tokens"] == 100 and spec["acceptance_rate"] == 0.4  # not the mean
    assert spec["mean_accepted_length"] == 1.0


def test_disk_tier_figures_are_summed_and_the_disk_hit_rate_recomputed() -> None:
    a = stats(100, 50, "t1", queries=1, query_tokens=100, hit_tokens=80)
    b = stats(100, 50, "t1", queries=1, query_tokens=300, hit_tokens=0)
    a["totals"]["prefix"]["disk_hit_tokens"] = 64
    a["disk"] = {"enabled": True, "blocks": 10, "bytes": 1000, "max_bytes": 5000,
                 "loaded_blocks": 4, "hit_tokens": 64, "corrupt_files": 1, "dir": "/kv/x"}
    b["disk"] = {"enabled": True, "blocks": 12, "bytes": 1200, "max_bytes": 5000,
                 "loaded_blocks": 0, "hit_tokens": 0, "corrupt_files": 2, "dir": "/kv/x"}
    doc = merge_cache_stats({"a": a, "b": b}, {})
    assert doc["totals"]["prefix"]["disk_hit_rate"] == 0.16  # 64 of 400 prompt tokens
    disk = doc["disk"]
    assert disk["blocks"] == 12 and disk["bytes"] == 1200  # one shared directory: not summed
    assert disk["loaded_blocks"] == 4 and disk["corrupt_files"] == 3 and disk["enabled"]
    assert disk["dirs"] == ["/kv/x"]
    assert "disk" not in merge_cache_stats({"a": stats(1, 1, "t", 1, 1, 0)}, {})


def test_refusals_come_back_as_the_engine_exceptions() -> None:
    assert isinstance(Refused.of("r", QueueFullError("full")).error(), QueueFullError)
    err = Refused.of("r", InvalidParameter("max_tokens", "too many", code="x")).error()
    assert isinstance(err, InvalidParameter) and (err.param, err.code) == ("max_tokens", "x")
    busy = Refused.of("r", NamespaceBusyError(["t1", "t2"])).error()
    assert isinstance(busy, NamespaceBusyError) and busy.namespaces == ["t1", "t2"]
