"""The serving benchmark's ``GET /metrics`` scraper: the server's own prefix-cache counters
(hermes_async's ``hermes_prefix_cache_*_total``, vLLM's ``vllm:prefix_cache_*_total``) and
hermes_async's step histograms, compared between two scrapes."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

STEP_SAMPLES = {  # hermes_async's step histograms: what limits a run
    "steps": "hermes_step_seconds_count", "step_seconds": "hermes_step_seconds_sum",
    "step_tokens": "hermes_step_tokens_sum", "step_seqs": "hermes_step_sequences_sum",
}
PREFIX_COUNTERS = {  # exporter: (queries sample, hits sample), both in tokens
    "hermes_async": ("hermes_prefix_cache_queries_total", "hermes_prefix_cache_hits_total"),
    "vllm": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
}


def parse_prefix_counters(text: str) -> dict[str, Any] | None:
    """Prefix-cache query and hit tokens (summed over label sets) from Prometheus text, or
    None when no known exporter's counters are there."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name] = samples.get(s.name, 0.0) + s.value
    for source, (queries, hits) in PREFIX_COUNTERS.items():
        if queries in samples and hits in samples:
            out = {"source": source, "queries": samples[queries], "hits": samples[hits]}
            out.update({k: samples[name] for k, name in STEP_SAMPLES.items() if name in samples})
            return out
    return None


def step_profile(before: dict[str, Any] | None, after: dict[str, Any] | None,
                 wall_s: float) -> dict[str, float] | None:
    """Where a hermes_async server's time went between two scrapes: the share of the wall
    time spent in forward steps, and tokens and sequences per step (None for other servers)."""
    if not before or not after or any(k not in before or k not in after for k in STEP_SAMPLES):
        return None
    steps = after["steps"] - before["steps"]
    if steps <= 0:
        return None
    busy = after["step_seconds"] - before["step_seconds"]
    return {"steps": steps, "forward_share": busy / wall_s if wall_s else None,
            "ms_per_step": 1e3 * busy / steps,
            "tokens_per_step": (after["step_tokens"] - before["step_tokens"]) / steps,
            "seqs_per_step": (after["step_seqs"] - before["step_seqs"]) / steps}


async def scrape_prefix_counters(session: aiohttp.ClientSession, root: str,
                                 headers: dict[str, str]) -> dict[str, Any] | None:
    """:func:`parse_prefix_counters` of ``GET {root}/metrics``; None on any failure."""
    try:
        async with session.get(f"{root}/metrics", headers=headers) as resp:
            if resp.status != 200:
                return None
            return parse_prefix_counters(await resp.text())
    except (aiohttp.ClientError, ValueError, OSError):
        return None


def prefix_hit_rate(before: dict[str, Any] | None, after: dict[str, Any] | None) -> float | None:
    """Hit tokens / queried tokens between two scrapes (None without both or no queries)."""
    if not before or not after:
        return None
    queries = after["queries"] - before["queries"]
    return (after["hits"] - before["hits"]) / queries if queries > 0 else None
