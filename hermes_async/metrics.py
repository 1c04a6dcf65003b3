"""Prometheus metrics of one engine (and its server), in a registry of their own.

No module-level registry: each :class:`EngineMetrics` owns a ``CollectorRegistry``, so two
engines in one process keep separate figures. Counters and histograms are updated by the
engine loop as things happen; gauges of queue and KV pool state are set once per step.
Names are a public contract (dashboards rely on them); see the server issue's list.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
                   120.0)
TOKEN_BUCKETS = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class EngineMetrics:
    """Every metric hermes_async exports; ``namespace`` labels where per-tenant figures help."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        ns = ["namespace"]
        self.requests_running = Gauge("hermes_num_requests_running",
                                      "Sequences in the running set", registry=r)
        self.requests_waiting = Gauge("hermes_num_requests_waiting",
                                      "Sequences waiting for admission", registry=r)
        self.kv_blocks_total = Gauge("hermes_kv_blocks_total", "KV pool blocks", registry=r)
        self.kv_blocks_free = Gauge("hermes_kv_blocks_free", "Free KV blocks", registry=r)
        self.kv_blocks_cached = Gauge("hermes_kv_blocks_cached",
                                      "KV blocks in the prefix tree, unpinned", registry=r)
        self.kv_blocks_pinned = Gauge("hermes_kv_blocks_pinned",
                                      "KV blocks in the prefix tree, pinned", registry=r)
        self.prefix_queries = Counter("hermes_prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache", ns,
                                      registry=r)
        self.prefix_hits = Counter("hermes_prefix_cache_hits",
                                   "Prompt tokens found in the prefix cache", ns, registry=r)
        self.prefix_matched = Histogram("hermes_prefix_cache_matched_tokens",
                                        "Matched length per admitted request", ns,
                                        buckets=TOKEN_BUCKETS, registry=r)
        self.assembly_queries = Counter("hermes_assembly_cache_queries",
                                        "Prompt assemblies requested", ns, registry=r)
        self.assembly_hits = Counter("hermes_assembly_cache_hits",
                                     "Prompt assemblies served whole from the cache", ns,
                                     registry=r)
        self.assembly_partial_hits = Counter("hermes_assembly_cache_partial_hits",
                                             "Prompt assemblies extending a cached prefix", ns,
                                             registry=r)
        self.evicted_blocks = Counter("hermes_evicted_blocks", "KV blocks evicted", registry=r)
        self.pruned_nodes = Counter("hermes_pruned_nodes",
                                    "Prefix-tree blocks pruned by the fork limit", registry=r)
        self.preemptions = Counter("hermes_preemptions", "Sequences preempted", registry=r)
        self.prompt_tokens = Counter("hermes_prompt_tokens", "Prompt tokens of requests", ns,
                                     registry=r)
        self.generation_tokens = Counter("hermes_generation_tokens", "Generated tokens", ns,
                                         registry=r)
        self.ttft = Histogram("hermes_time_to_first_token_seconds", "Time to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("hermes_inter_token_latency_seconds", "Time between tokens",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("hermes_e2e_request_latency_seconds", "Request latency",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.request_errors = Counter("hermes_request_errors", "Failed requests by code",
                                      ["code"], registry=r)
        self.step_tokens = Histogram("hermes_step_tokens", "Tokens per forward step",
                                     buckets=TOKEN_BUCKETS, registry=r)
        self.step_seqs = Histogram("hermes_step_sequences", "Sequences per forward step",
                                   buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.step_seconds = Histogram("hermes_step_seconds", "Forward step wall time",
                                      buckets=LATENCY_BUCKETS, registry=r)

    def exposition(self) -> bytes:
        """Prometheus text format of every metric in this registry."""
        return generate_latest(self.registry)
