"""Prometheus metrics of one engine (and its server), in a registry of their own.

No module-level registry: each :class:`EngineMetrics` owns a ``CollectorRegistry``, so two
engines in one process keep separate figures. Counters and histograms are updated by the
engine loop as things happen; gauges of queue and KV pool state are set once per step.
Names are a public contract (dashboards rely on them); see the README's metrics table.

The prefix- and assembly-cache counters are not counted here: the engine's cache observer
counts each event once, and :meth:`EngineMetrics.bind_cache_figures` exports those same figures
at scrape time, so ``/metrics`` and ``/cache/stats`` can never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CacheTotals = Mapping[str, Mapping[str, Mapping[str, float]]]
"""namespace -> group (``prefix``/``assembly``) -> figure -> value since start."""

CACHE_COUNTERS = (  # (metric name, help, group, figure)
    ("hermes_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", "prefix",
     "query_tokens"),
    ("hermes_prefix_cache_hits", "Prompt tokens found in the prefix cache", "prefix",
     "hit_tokens"),
    ("hermes_prefix_cache_disk_hits", "Prompt tokens of those hits loaded back from the disk "
     "tier", "prefix", "disk_hit_tokens"),
    ("hermes_assembly_cache_queries", "Prompt assemblies requested", "assembly", "queries"),
    ("hermes_assembly_cache_hits", "Prompt assemblies served whole from the cache", "assembly",
     "hits"),
    ("hermes_assembly_cache_partial_hits", "Prompt assemblies extending a cached prefix",
     "assembly", "partial"),
)


class CacheFigures(Collector):
    """Exports the cache observer's per-namespace totals as Prometheus counters."""

    def __init__(self, totals: Callable[[], CacheTotals]) -> None:
        self._totals = totals

    def collect(self) -> Iterator[CounterMetricFamily]:
        totals = self._totals()
        for name, doc, group, figure in CACHE_COUNTERS:
            family = CounterMetricFamily(name, doc, labels=["namespace"])
            for ns in sorted(totals):
                family.add_metric([ns], totals[ns][group].get(figure, 0.0))
            yield family

GRAMMAR_COUNTERS = (  # (metric name, help, figure of the compiler's stats)
    ("hermes_grammar_cache_hits", "Structured-output constraints found compiled", "hits"),
    ("hermes_grammar_cache_misses", "Structured-output constraints compiled", "misses"),
    ("hermes_grammar_compile_failures", "Structured-output constraints found invalid",
     "failures"),
    ("hermes_grammar_compile_seconds", "Time spent compiling constraints", "compile_seconds"),
)


class GrammarFigures(Collector):
    """Exports the grammar compiler's cache figures (its ``stats().as_dict()``)."""

    def __init__(self, figures: Callable[[], Mapping[str, float]]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[CounterMetricFamily]:
        figures = self._figures()
        for name, doc, figure in GRAMMAR_COUNTERS:
            yield CounterMetricFamily(name, doc, value=float(figures.get(figure, 0.0)))


DISK_FIGURES = (  # (metric name, help, figure of the disk tier's stats, counter?)
    ("hermes_kv_disk_enabled", "1 while the prefix cache's disk tier works", "enabled", False),
    ("hermes_kv_disk_blocks", "KV blocks on the disk tier", "blocks", False),
    ("hermes_kv_disk_bytes", "Bytes of KV block files on the disk tier", "bytes", False),
    ("hermes_kv_disk_max_bytes", "The disk tier's byte bound", "max_bytes", False),
    ("hermes_kv_disk_write_backlog_blocks", "Evicted blocks waiting to be written",
     "backlog_blocks", False),
    ("hermes_kv_disk_written_blocks", "KV blocks written to the disk tier", "written_blocks",
     True),
    ("hermes_kv_disk_loaded_blocks", "KV blocks loaded back from the disk tier",
     "loaded_blocks", True),
    ("hermes_kv_disk_load_seconds", "Time spent loading blocks back (reading, checking, "
     "copying into the pool)", "load_seconds", True),
    ("hermes_kv_disk_removed_blocks", "Block files removed by the byte bound",
     "removed_blocks", True),
    ("hermes_kv_disk_dropped_blocks", "Evicted blocks not written: the backlog was full",
     "dropped_blocks", True),
    ("hermes_kv_disk_corrupt_files", "Corrupt, truncated or foreign block files dropped",
     "corrupt_files", True),
    ("hermes_kv_disk_write_errors", "Write errors (each turns the tier off)", "write_errors",
     True),
)


class DiskFigures(Collector):
    """Exports the prefix cache's disk tier figures (``KVCacheManager.disk_stats()``)."""

    def __init__(self, figures: Callable[[], Mapping[str, object] | None]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        figures = self._figures()
        if figures is None:
            return
        for name, doc, figure, counter in DISK_FIGURES:
            family = CounterMetricFamily if counter else GaugeMetricFamily
            yield family(name, doc, value=float(figures.get(figure, 0.0)))  # type: ignore[arg-type]


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
                                      "KV blocks in the prefix tree, unreferenced (evictable)",
                                      registry=r)
        self.kv_blocks_referenced = Gauge(
            "hermes_kv_blocks_referenced",
            "KV blocks in the prefix tree held by running requests or operator pins", registry=r)
        self.kv_blocks_pinned = Gauge("hermes_kv_blocks_pinned",
                                      "KV blocks held by operator pins (/cache/warm pin_ttl_s)",
                                      registry=r)
        self.prefix_matched = Histogram("hermes_prefix_cache_matched_tokens",
                                        "Matched length per admitted request", ns,
                                        buckets=TOKEN_BUCKETS, registry=r)
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
        # speculative decoding, with vLLM's meanings: a draft is one sequence's proposal in one
        # step; accepted tokens are the drafted tokens verification kept
        self.spec_drafts = Counter("hermes_spec_decode_num_drafts",
                                   "Speculative drafts verified", registry=r)
        self.spec_draft_tokens = Counter("hermes_spec_decode_num_draft_tokens",
                                         "Drafted tokens verified", registry=r)
        self.spec_accepted_tokens = Counter("hermes_spec_decode_num_accepted_tokens",
                                            "Drafted tokens accepted", registry=r)
        self.spec_accepted_per_pos = Counter(
            "hermes_spec_decode_num_accepted_tokens_per_pos",
            "Drafted tokens accepted, by their position in the draft (0: first)", ["position"],
            registry=r)

        self._cache_figures: CacheFigures | None = None
        self._grammar_figures: GrammarFigures | None = None
        self._disk_figures: DiskFigures | None = None

    def bind_cache_figures(self, totals: Callable[[], CacheTotals]) -> None:
        """Export ``totals()`` (the cache observer's) as the cache counters; rebinding (an
        engine restarted with a new observer) replaces the previous source."""
        if self._cache_figures is not None:
            self.registry.unregister(self._cache_figures)
        self._cache_figures = CacheFigures(totals)
        self.registry.register(self._cache_figures)

    def bind_grammar_figures(self, figures: Callable[[], Mapping[str, float]]) -> None:
        """Export ``figures()`` (the grammar compiler's) as the grammar-cache counters."""
        if self._grammar_figures is not None:
            self.registry.unregister(self._grammar_figures)
        self._grammar_figures = GrammarFigures(figures)
        self.registry.register(self._grammar_figures)

    def bind_disk_figures(self, figures: Callable[[], Mapping[str, object] | None]) -> None:
        """Export ``figures()`` (the disk tier's) as the ``hermes_kv_disk_*`` metrics."""
        if self._disk_figures is not None:
            self.registry.unregister(self._disk_figures)
        self._disk_figures = DiskFigures(figures)
        self.registry.register(self._disk_figures)

    def exposition(self) -> bytes:
        """Prometheus text format of every metric in this registry."""
        return generate_latest(self.registry)
