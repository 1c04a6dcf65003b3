"""``AsyncEngine``: the embeddable engine on the caller's asyncio loop.

    from hermes_async import AsyncEngine, EngineConfig, SamplingParams

    async with AsyncEngine(EngineConfig()) as engine:
        async for out in engine.generate("Hello", SamplingParams(max_tokens=32)):
            print(out.text, end="")

One task runs the step loop (plan -> forward in a dedicated worker thread -> apply results;
with ``scheduler.overlap`` a step's outputs are built while the next forward runs); another
evicts and prunes the prefix cache in the background between steps. Breaking out of
``generate`` or cancelling the task that iterates it aborts the request and releases its KV
blocks at once. No globals: several engines can live in one process.

This class is the engine layer's: it is built from :class:`EngineParts` (injected, or made by a
``loader``) and never imports a model. ``hermes_async.AsyncEngine`` (``hermes_async.builder``)
is the same class with the default loader, so ``AsyncEngine(EngineConfig())`` loads the
embedded model.

Everything a front end needs is a public method here (the OpenAI layer and the server use
nothing else): :meth:`encode_text`, :meth:`assemble`, :meth:`add_request`, :meth:`generate`,
:meth:`abort`, :meth:`warm`, :meth:`cache_stats`, :meth:`reset_cache`, :meth:`load`,
:meth:`metrics_text`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_async.cache.structs import CacheUsage
from hermes_async.config import EngineConfig
from hermes_async.engine.core import EngineCore, served_max_model_len
from hermes_async.engine.errors import EngineError, NamespaceBusyError, QueueFullError
from hermes_async.engine.front import FrontMethods, PromptFront, check_context_length
from hermes_async.engine.output_text import output_text_factory
from hermes_async.engine.parts import (
    EngineParts,
    GrammarCompiler,
    OutputTextFactory,
    PartsLoader,
    Tokenizer,
)
from hermes_async.engine.request import CompiledConstraint, EngineRequest, RequestOutput
from hermes_async.engine.scheduler import ScheduledBatch
from hermes_async.metrics import EngineMetrics
from hermes_async.observe.cache_observer import CacheObserver
from hermes_async.prompt import AssembledPrompt, PromptAssembler
from hermes_async.step import SampledToken, SequenceStep, StepRunner
from hermes_async.types import InvalidParameter, SamplingParams

log = logging.getLogger("hermes_async.engine")

DEFAULT_NAMESPACE = "default"

__all__ = ["DEFAULT_NAMESPACE", "AsyncEngine", "CacheResetResult", "EngineError", "EngineLoad",
           "NamespaceBusyError", "QueueFullError", "WarmResult"]


def timed_execute(execute: Callable[[list[SequenceStep]], list[SampledToken | None]],
                  steps: list[SequenceStep]) -> tuple[list[SampledToken | None], float]:
    """``execute(steps)`` (in the worker thread) and its wall time in seconds."""
    t0 = time.perf_counter()
    results = execute(steps)
    return results, time.perf_counter() - t0


def report_decoder(tokenizer: Tokenizer | None) -> Callable[[Sequence[int]], str]:
    """Token ids -> text for reports (special tokens shown); ids as text without a decoder."""
    decode = getattr(tokenizer, "decode", None)
    if decode is None:
        return lambda ids: " ".join(map(str, ids))
    return lambda ids: decode(list(ids), skip_special_tokens=False)


@dataclass(frozen=True)
class WarmResult:
    """What :meth:`AsyncEngine.warm` left in the cache: the prompt's length, how much of it a
    request with this prompt now finds cached, and the pin (``None`` if not asked or refused:
    then ``pin_error`` says why)."""

    namespace: str
    prompt_tokens: int
    cached_tokens: int
    already_cached_tokens: int
    pin: dict[str, Any] | None
    pin_error: str | None = None


@dataclass(frozen=True)
class CacheResetResult:
    """What :meth:`AsyncEngine.reset_cache` dropped (``namespace`` None: every namespace)."""

    namespace: str | None
    freed_blocks: int
    unpinned: int


@dataclass(frozen=True)
class EngineLoad:
    """Requests in flight, sequences running and waiting, and the KV pool by state."""

    requests: int
    running: int
    waiting: int
    blocks: CacheUsage


class AsyncEngine(FrontMethods):
    """Continuous-batching engine over :class:`EngineParts`.

    Give either ``loader`` (called in the worker thread at :meth:`start`: loading takes
    seconds) or the parts themselves: ``runner`` and ``tokenizer`` (plus, optionally,
    ``eos_token_ids`` -- default: the tokenizer's --, ``output_text`` -- default: the
    incremental detokenizer --, ``assembler`` for chat messages and ``grammars`` for
    structured outputs).
    """

    def __init__(self, config: EngineConfig | None = None, *,
                 loader: PartsLoader | None = None,
                 runner: StepRunner | None = None, tokenizer: Tokenizer | None = None,
                 eos_token_ids: Sequence[int] | None = None,
                 output_text: OutputTextFactory | None = None,
                 assembler: PromptAssembler | None = None,
                 grammars: GrammarCompiler | None = None,
                 metrics: EngineMetrics | None = None,
                 background_interval_s: float = 0.05) -> None:
        self.config = config or EngineConfig()
        self._loader = loader
        self._injected = (runner, tokenizer, eos_token_ids, output_text, assembler, grammars)
        if loader is None and (runner is None or tokenizer is None):
            raise EngineError("give a loader, or a runner and a tokenizer "
                              "(hermes_async.AsyncEngine loads the configured model)")
        self.metrics = metrics or EngineMetrics()
        self.background_interval_s = background_interval_s
        self.parts: EngineParts | None = None
        self.core: EngineCore | None = None  # the engine's internals: for the engine's tests
        self.observer: CacheObserver | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._tasks: list[asyncio.Task] = []
        self._wake = asyncio.Event()
        self._accepting = False
        self._front: PromptFront | None = None

    # ----- life cycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the parts (in the worker thread) and start the loop; idempotent."""
        if self.core is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hermes-forward")
        if self.parts is None:
            self.parts = await self._build_parts()
        parts = self.parts
        self.observer = CacheObserver(parts.runner.block_size, report_decoder(parts.tokenizer))
        self._front = PromptFront(parts.tokenizer, parts.assembler, parts.grammars,
                                  self.config.structured, self._count_assembly)
        self.metrics.bind_cache_figures(self.observer.totals)
        if parts.grammars is not None:
            grammars = parts.grammars
            self.metrics.bind_grammar_figures(lambda: grammars.stats().as_dict())
        self._wake = asyncio.Event()
        loop, wake = asyncio.get_running_loop(), self._wake

        def wake_from_thread() -> None:  # a disk load finished (the tier's loader thread)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to wake
                loop.call_soon_threadsafe(wake.set)

        self.core = EngineCore(self.config, parts.runner, parts.eos_token_ids,
                               parts.output_text, self.metrics, self.observer,
                               wake=wake_from_thread)
        if self.core.cache.disk is not None:
            self.metrics.bind_disk_figures(self.core.cache.disk_stats)
        self._accepting = True
        self._tasks = [asyncio.create_task(self._step_loop(), name="hermes-step-loop"),
                       asyncio.create_task(self._background_loop(), name="hermes-background")]
        for i, item in enumerate(self.config.cache.warm):  # e.g. after a template upgrade
            res = await self.warm(prompt=item.get("prompt"), messages=item.get("messages"),
                                  namespace=item.get("namespace"),
                                  pin_ttl_s=item.get("pin_ttl_s"))
            log.info("warmed cache.warm[%d]: %d of %d prompt tokens cached in %r%s", i,
                     res.cached_tokens, res.prompt_tokens, res.namespace,
                     f", pinned for {item['pin_ttl_s']} s" if res.pin else "")

    def _count_assembly(self, namespace: str | None, prompt: AssembledPrompt) -> None:
        if self.observer is not None:
            self.observer.on_assembly(namespace or DEFAULT_NAMESPACE, prompt.cache_outcome)

    async def _build_parts(self) -> EngineParts:
        runner, tokenizer, eos, output_text, assembler, grammars = self._injected
        if runner is None or tokenizer is None:
            assert self._loader is not None
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, self._loader, self.config)
        if eos is None:  # injected tokenizer without explicit ids: take the tokenizer's
            eos = [getattr(tokenizer, "eos_token_id", None)]
        return EngineParts(runner, tokenizer, frozenset(e for e in eos if e is not None),
                           output_text or output_text_factory(tokenizer), assembler,
                           grammars=grammars)

    async def stop(self, drain_timeout_s: float = 0.0) -> None:
        """Stop admitting; let in-flight requests finish for up to ``drain_timeout_s``, abort
        the rest, stop the tasks and the worker thread. The cache is left consistent."""
        if self.core is None:
            return
        self._accepting = False
        deadline = time.monotonic() + drain_timeout_s
        while self.core.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for rid in list(self.core.requests):
            self.core.abort(rid)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        core = self.core
        await asyncio.get_running_loop().run_in_executor(None, core.close)  # the disk tier
        core.cache.check_integrity()
        self.core = None

    async def __aenter__(self) -> AsyncEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ----- what the engine serves -------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        return self.core is not None and self._accepting

    def _require_parts(self) -> EngineParts:
        if self.parts is None:
            raise EngineError("the engine is not started")
        return self.parts

    @property
    def runner(self) -> StepRunner:
        return self._require_parts().runner

    @property
    def tokenizer(self) -> Tokenizer:
        return self._require_parts().tokenizer

    @property
    def model_dir(self) -> Path | None:
        return self.parts.model_dir if self.parts is not None else None

    @property
    def max_model_len(self) -> int:
        """The longest prompt + completion served: the model's context, capped to what the KV
        pool holds (:func:`~hermes_async.engine.core.served_max_model_len`)."""
        return served_max_model_len(self._require_parts().runner)

    @property
    def has_chat_template(self) -> bool:
        return self._require_parts().assembler is not None

    @property
    def front(self) -> PromptFront:
        """Prompts, tool parsing and grammars of this engine's model (:class:`PromptFront`);
        the prompt methods (:class:`FrontMethods`) delegate to it."""
        if self._front is None:
            raise EngineError("the engine is not started")
        return self._front

    # ----- requests ---------------------------------------------------------------------------
    async def generate(self, prompt: str | None = None, params: SamplingParams | None = None,
                       *, messages: list[dict] | None = None,
                       token_ids: Sequence[int] | None = None, tools: list[Any] | None = None,
                       request_id: str | None = None,
                       namespace: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream the outputs of one request. Leaving the loop early aborts it."""
        ids = await self.prompt_ids(prompt, messages, token_ids, tools=tools,
                                    namespace=namespace)
        grammar = None
        if params is not None and params.structured is not None:
            grammar = await self.compile_grammar(params.structured)
        req = self.add_request(ids, params, request_id=request_id, namespace=namespace,
                               grammar=grammar)
        done = False
        try:
            while not done:
                out = await req.queue.get()
                done = out.usage is not None  # the request's last output carries its usage
                yield out
        finally:
            if not done:
                self.abort(req.request_id)

    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, namespace: str | None = None,
                    grammar: CompiledConstraint | None = None) -> EngineRequest:
        """Queue a request whose outputs arrive on ``request.queue``; checks limits first.

        ``grammar``: ``params.structured`` compiled by :meth:`compile_grammar` (required when
        it is set). Raises :class:`InvalidParameter` (``context_length_exceeded``, token ids
        of ``logit_bias`` / ``allowed_token_ids`` outside the vocabulary), :class:`QueueFullError`
        and :class:`EngineError` (not running)."""
        core = self._require_core()
        params = params or SamplingParams()
        if params.structured is not None and grammar is None:
            raise InvalidParameter("response_format", "a structured output needs its compiled "
                                   "grammar: await engine.compile_grammar(params.structured)")
        if params.logit_bias:
            self.check_token_ids([t for t, _ in params.logit_bias], "logit_bias")
        if params.allowed_token_ids is not None:
            self.check_token_ids(params.allowed_token_ids, "allowed_token_ids")
        check_context_length(len(prompt_ids), params.max_tokens, self.max_model_len)
        sched = core.scheduler
        cfg = self.config.scheduler
        if len(sched.waiting) >= cfg.max_waiting or \
                sched.num_waiting_tokens + len(prompt_ids) > cfg.max_waiting_tokens:
            raise QueueFullError("the request queue is full; retry later")
        rid = request_id or f"req-{uuid.uuid4().hex}"
        if rid in core.requests:
            raise InvalidParameter("request_id", f"request id {rid!r} is already in flight")
        req = EngineRequest(rid, namespace or DEFAULT_NAMESPACE, list(prompt_ids), params,
                            asyncio.Queue(), grammar=grammar,
                            bad_words_ids=self.front.bad_words_ids(params.bad_words))
        core.add(req)
        self._wake.set()
        return req

    async def submit(self, prompt_ids: list[int], params: SamplingParams | None = None, *,
                     request_id: str | None = None, namespace: str | None = None,
                     grammar: CompiledConstraint | None = None) -> EngineRequest:
        """:meth:`add_request` for front ends that may run on a remote engine (whose
        acceptance needs a round trip); here it is the same call."""
        return self.add_request(prompt_ids, params, request_id=request_id,
                                namespace=namespace, grammar=grammar)

    def abort(self, request_id: str) -> bool:
        """Abort a request; its blocks are released at once. False if not in flight."""
        return self.core is not None and self.core.abort(request_id)

    # ----- the prefix cache -------------------------------------------------------------------
    async def warm(self, prompt: str | None = None, *, messages: list[dict] | None = None,
                   token_ids: Sequence[int] | None = None, tools: list[Any] | None = None,
                   namespace: str | None = None,
                   pin_ttl_s: float | None = None) -> WarmResult:
        """Prefill a prompt into the prefix cache without answering it; optionally pin it.

        The prompt runs through the scheduler like any request (chunked, batched with the
        traffic); the one token sampled at the end of the prefill is dropped. With
        ``pin_ttl_s`` its cached blocks are pinned before the request lets go of them: they
        survive eviction until ``pin_ttl_s`` passes with no request matching the whole pinned
        prefix (each such hit restarts the clock). Raises like :meth:`add_request`.
        """
        if pin_ttl_s is not None and pin_ttl_s <= 0:
            raise InvalidParameter("pin_ttl_s", "pin_ttl_s must be a positive number of seconds")
        ns = namespace or DEFAULT_NAMESPACE
        ids = await self.prompt_ids(prompt, messages, token_ids, tools=tools, namespace=ns)
        core = self._require_core()
        before = core.cache.probe(ns, ids)
        req = self.add_request(ids, SamplingParams(max_tokens=1, ignore_eos=True),
                               request_id=f"warm-{uuid.uuid4().hex}", namespace=ns)
        req.pin_ttl_s = pin_ttl_s
        try:
            while (out := await req.queue.get()).usage is None:
                pass
        finally:
            if not req.finished:
                self.abort(req.request_id)
        if out.error is not None:
            raise EngineError(f"warm-up failed: {out.error}")
        cache = self._require_core().cache
        pin = req.pin.to_dict(cache.now(), cache.block_size) if req.pin is not None else None
        return WarmResult(ns, len(ids), cache.probe(ns, ids), before, pin, req.pin_error)

    def cache_namespaces(self) -> list[str]:
        """Every namespace with figures or cached blocks."""
        core, observer = self._require_core(), self.observer
        assert observer is not None
        return sorted(set(observer.namespaces()) | set(core.cache.tree.stats()))

    def cache_stats(self, namespaces: Sequence[str] | None = None,
                    top: int = 10) -> dict[str, Any]:
        """The ``/cache/stats`` document (see ``CacheObserver.snapshot``) for ``namespaces``
        (default: every one); ``top`` divergence points per namespace; ``grammar``: the
        compiled-grammar cache's figures (engine-wide) when structured outputs are on."""
        core, observer = self._require_core(), self.observer
        assert observer is not None
        names = self.cache_namespaces() if namespaces is None else list(namespaces)
        doc = observer.snapshot(core.cache, running=len(core.scheduler.running),
                                waiting=len(core.scheduler.waiting), namespaces=names, top=top)
        grammar = self.grammar_stats()
        if grammar is not None:
            doc["grammar"] = grammar  # engine-wide: compiled constraints are not per tenant
        if core.drafter is not None:  # engine-wide acceptance; the answer trees' sizes
            doc["speculative"] = core.drafter.stats()
        return doc

    def reset_cache(self, namespace: str | None = None) -> CacheResetResult:
        """Drop the cached blocks, operator pins, figures and divergence sample of one
        namespace (None: every namespace).

        The one busy rule: refused with :class:`NamespaceBusyError`, changing nothing, while a
        request of that namespace (any, for None) is in flight -- queued ones included.
        """
        core, observer = self._require_core(), self.observer
        assert observer is not None
        busy = sorted({r.namespace for r in core.requests.values()
                       if namespace is None or r.namespace == namespace})
        if busy:
            raise NamespaceBusyError(busy)
        unpinned = len(core.cache.pins_of(namespace))
        freed = core.cache.reset(namespace)  # no request holds blocks there: checked above
        for ns in [namespace] if namespace is not None else observer.namespaces():
            observer.forget(ns)
        if core.drafter is not None:
            core.drafter.forget(namespace)  # its earlier answers draft nothing more
        return CacheResetResult(namespace, freed, unpinned)

    def cached_blocks(self) -> dict[str, int]:
        """Blocks the prefix tree holds per namespace (what a replica reports to a router)."""
        stats = self._require_started_core().cache.tree.stats()
        return {ns: st.blocks for ns, st in stats.items()}

    # ----- awaitable twins for front ends (a remote engine fans these out to its replicas) --
    async def report_cache_namespaces(self) -> list[str]:
        """:meth:`cache_namespaces`, awaitable."""
        return self.cache_namespaces()

    async def report_cache_stats(self, namespaces: Sequence[str] | None = None,
                                 top: int = 10) -> dict[str, Any]:
        """:meth:`cache_stats`, awaitable."""
        return self.cache_stats(namespaces, top=top)

    async def clear_cache(self, namespace: str | None = None) -> CacheResetResult:
        """:meth:`reset_cache`, awaitable."""
        return self.reset_cache(namespace)

    async def report_metrics(self) -> bytes:
        """:meth:`metrics_text`, awaitable."""
        return self.metrics_text()

    # ----- figures ----------------------------------------------------------------------------
    def load(self) -> EngineLoad:
        """Requests in flight, the scheduler's queues and the KV pool by state."""
        core = self._require_started_core()
        s = core.scheduler
        return EngineLoad(len(core.requests), len(s.running), len(s.waiting), core.cache.usage())

    def check_integrity(self) -> None:
        """Check every KV cache invariant (raises ``IntegrityError``); for tests and soaks."""
        self._require_started_core().cache.check_integrity()

    def metrics_text(self) -> bytes:
        """Prometheus text exposition, queue and KV-pool gauges refreshed now."""
        if self.core is not None:
            self.core.update_gauges()
        return self.metrics.exposition()

    # ----- loops ------------------------------------------------------------------------------
    def _require_started_core(self) -> EngineCore:
        if self.core is None:
            raise EngineError("the engine is not started")
        return self.core

    def _require_core(self) -> EngineCore:
        if self.core is None or not self._accepting:
            raise EngineError("the engine is not running (starting up or shutting down)")
        return self.core

    async def _step_loop(self) -> None:
        """Plan, forward in the worker thread, commit -- step after step.

        With ``scheduler.overlap`` a step's emit (``EngineCore.emit_deferred``: detokenize,
        stop strings, outputs) runs once the next step's forward is launched, while it runs;
        without, right after its commit. Either way nothing stays deferred across any other
        await, so handlers (new requests, aborts) and the background task only ever run
        between a step's emit and the next commit.
        """
        core = self._require_started_core()
        overlap = self.config.scheduler.overlap
        while True:
            if not core.scheduler.has_work:
                core.emit_deferred()
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = core.plan_step()
            if not batch.steps:
                core.emit_deferred()
                if core.cache.num_loading and not core.cache.loads_finished():
                    self._wake.clear()  # waiting on disk loads: their thread wakes the loop
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), 0.05)
                else:
                    await asyncio.sleep(0)
                continue
            await self._run_step(core, batch)
            if not overlap:
                core.emit_deferred()
                await asyncio.sleep(0)  # let handlers and the background task run

    async def _run_step(self, core: EngineCore, batch: ScheduledBatch) -> None:
        """Launch the forward of ``batch``, emit the previous step while it runs, then commit
        ``batch`` (or fail its requests if the forward raised)."""
        loop = asyncio.get_running_loop()
        forward = loop.run_in_executor(self._executor, timed_execute, core.runner.execute,
                                       batch.steps)
        core.emit_deferred()  # overlapped with the forward
        try:
            results, seconds = await forward
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any runner failure fails this step only
            core.fail_step(batch, e)
            return
        core.commit_step(batch, results, seconds)

    async def _background_loop(self) -> None:
        core = self.core
        assert core is not None
        while True:
            await asyncio.sleep(self.background_interval_s)
            try:
                core.background()
            except Exception:  # keep the loop alive; integrity checks will catch real damage
                log.exception("background cache maintenance failed")
