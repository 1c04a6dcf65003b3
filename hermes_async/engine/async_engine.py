"""``AsyncEngine``: the embeddable engine on the caller's asyncio loop.

    async with AsyncEngine(EngineConfig()) as engine:
        async for out in engine.generate("Hello", SamplingParams(max_tokens=32)):
            print(out.text, end="")

One task runs the step loop (plan -> forward in a dedicated worker thread -> apply results);
another evicts and prunes the prefix cache in the background between steps. Breaking out of
``generate`` or cancelling the task that iterates it aborts the request and releases its KV
blocks at once. No globals: several engines can live in one process.
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
from typing import TYPE_CHECKING, Any

from hermes_async.config import EngineConfig
from hermes_async.engine.core import EngineCore, OutputTextFactory
from hermes_async.engine.request import EngineRequest, RequestOutput
from hermes_async.engine.runner_protocol import StepRunner
from hermes_async.metrics import EngineMetrics
from hermes_async.types import InvalidParameter, SamplingParams

if TYPE_CHECKING:
    from hermes_async.observe.cache_observer import CacheObserver

log = logging.getLogger("hermes_async.engine")

DEFAULT_NAMESPACE = "default"


def output_text_factory(tokenizer: Any) -> OutputTextFactory:
    """Per-sequence :class:`OutputText` (incremental detokenizer + stop strings)."""
    from hermes_async.engine.output_text import OutputText

    def make(prompt_ids: list[int], stops: tuple[str, ...]) -> OutputText:
        return OutputText(tokenizer, prompt_ids, stops)

    return make


def report_decoder(tokenizer: Any) -> Callable[[Sequence[int]], str]:
    """Token ids -> text for reports (special tokens shown); ids as text without a decoder."""
    decode = getattr(tokenizer, "decode", None)
    if decode is None:
        return lambda ids: " ".join(map(str, ids))
    return lambda ids: decode(list(ids), skip_special_tokens=False)


class EngineError(RuntimeError):
    """The engine is not running, or is shutting down (the server's 503)."""


class QueueFullError(RuntimeError):
    """The admission queue is over its bound (the server's 429)."""


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


class AsyncEngine:
    """Continuous-batching engine. Build with a config (the embedded default model unless
    ``config.model.path`` says otherwise), or inject a ``runner``/``tokenizer`` pair."""

    def __init__(self, config: EngineConfig | None = None, *, runner: StepRunner | None = None,
                 tokenizer: Any = None, eos_token_ids: Sequence[int] | None = None,
                 encode_messages: Callable[[list[dict]], list[int]] | None = None,
                 output_text: OutputTextFactory | None = None,
                 metrics: EngineMetrics | None = None,
                 background_interval_s: float = 0.05) -> None:
        self.config = config or EngineConfig()
        self.runner = runner
        self.tokenizer = tokenizer
        self._eos = eos_token_ids
        self._encode_messages = encode_messages
        self._output_text = output_text
        self.metrics = metrics or EngineMetrics()
        self.background_interval_s = background_interval_s
        self.core: EngineCore | None = None
        self.observer: CacheObserver | None = None
        self.assembler: Any = None  # hermes_async.prompt.PromptAssembler once started
        self.model_dir: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._tasks: list[asyncio.Task] = []
        self._wake = asyncio.Event()
        self._accepting = False

    # ----- life cycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the model (in the worker thread) and start the loop; idempotent."""
        if self.core is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hermes-forward")
        loop = asyncio.get_running_loop()
        if self.runner is None or self.tokenizer is None:
            from hermes_async.wiring import build_components  # the one place wiring model in

            parts = await loop.run_in_executor(self._executor, build_components, self.config)
            self.assembler = self.assembler or parts.assembler
            self.model_dir = parts.model_dir
            self.runner = self.runner or parts.runner
            self.tokenizer = self.tokenizer or parts.tokenizer
            self._eos = self._eos if self._eos is not None else parts.eos_token_ids
            self._encode_messages = self._encode_messages or parts.encode_messages
            self._output_text = self._output_text or parts.output_text
        if self._output_text is None:
            self._output_text = output_text_factory(self.tokenizer)
        eos = self._eos
        if eos is None:  # injected tokenizer without explicit ids: take the tokenizer's
            eos = [getattr(self.tokenizer, "eos_token_id", None)]
        from hermes_async.observe.cache_observer import CacheObserver

        self.observer = CacheObserver(self.runner.block_size, report_decoder(self.tokenizer))
        self.core = EngineCore(self.config, self.runner,
                               frozenset(e for e in eos if e is not None),
                               self._output_text, self.metrics, self.observer)
        self._wake = asyncio.Event()
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
        self.core.cache.check_integrity()
        self.core = None

    async def __aenter__(self) -> AsyncEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def is_running(self) -> bool:
        return self.core is not None and self._accepting

    @property
    def max_model_len(self) -> int:
        if self.runner is None:
            raise EngineError("the engine is not started")
        return self.runner.max_model_len

    # ----- requests ---------------------------------------------------------------------------
    def encode(self, prompt: str | None = None, messages: list[dict] | None = None,
               token_ids: Sequence[int] | None = None) -> list[int]:
        """Token ids of exactly one of: raw text, chat messages (the model's template), ids."""
        given = [x is not None for x in (prompt, messages, token_ids)]
        if sum(given) != 1:
            raise InvalidParameter("prompt", "give exactly one of prompt, messages, token_ids")
        if token_ids is not None:
            ids = [int(t) for t in token_ids]
        elif messages is not None:
            if self._encode_messages is None:
                raise InvalidParameter("messages", "this engine has no chat template")
            ids = list(self._encode_messages(messages))
        else:
            ids = list(self.tokenizer.encode(prompt, add_special_tokens=False))
        if not ids:
            raise InvalidParameter("prompt", "the prompt is empty")
        return ids

    async def generate(self, prompt: str | None = None, params: SamplingParams | None = None,
                       *, messages: list[dict] | None = None,
                       token_ids: Sequence[int] | None = None, request_id: str | None = None,
                       namespace: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream the outputs of one request. Leaving the loop early aborts it."""
        req = self.add_request(self.encode(prompt, messages, token_ids), params,
                               request_id=request_id, namespace=namespace)
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
                    request_id: str | None = None,
                    namespace: str | None = None) -> EngineRequest:
        """Queue a request whose outputs arrive on ``request.queue``; checks limits first."""
        core = self._require_core()
        params = params or SamplingParams()
        max_len = core.runner.max_model_len
        if len(prompt_ids) >= max_len:
            raise InvalidParameter("messages", f"the prompt has {len(prompt_ids)} tokens; this "
                                   f"model's context is {max_len} tokens",
                                   code="context_length_exceeded")
        if params.max_tokens is not None and len(prompt_ids) + params.max_tokens > max_len:
            raise InvalidParameter("max_tokens", f"prompt ({len(prompt_ids)} tokens) plus "
                                   f"max_tokens ({params.max_tokens}) exceeds the context of "
                                   f"{max_len} tokens", code="context_length_exceeded")
        sched = core.scheduler
        cfg = self.config.scheduler
        if len(sched.waiting) >= cfg.max_waiting or \
                sched.num_waiting_tokens + len(prompt_ids) > cfg.max_waiting_tokens:
            raise QueueFullError("the request queue is full; retry later")
        rid = request_id or f"req-{uuid.uuid4().hex}"
        if rid in core.requests:
            raise InvalidParameter("request_id", f"request id {rid!r} is already in flight")
        req = EngineRequest(rid, namespace or DEFAULT_NAMESPACE, list(prompt_ids), params,
                            asyncio.Queue())
        core.add(req)
        self._wake.set()
        return req

    async def warm(self, prompt: str | None = None, *, messages: list[dict] | None = None,
                   token_ids: Sequence[int] | None = None, namespace: str | None = None,
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
        ids = self.encode(prompt, messages, token_ids)
        ns = namespace or DEFAULT_NAMESPACE
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

    def abort(self, request_id: str) -> bool:
        """Abort a request; its blocks are released at once. False if not in flight."""
        return self.core is not None and self.core.abort(request_id)

    # ----- loops ------------------------------------------------------------------------------
    def _require_core(self) -> EngineCore:
        if self.core is None or not self._accepting:
            raise EngineError("the engine is not running (starting up or shutting down)")
        return self.core

    async def _step_loop(self) -> None:
        loop = asyncio.get_running_loop()
        core = self.core
        assert core is not None
        while True:
            if not core.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, steps, rows = core.plan_step()
            if not batch.entries:
                await asyncio.sleep(0)
                continue
            t0 = time.perf_counter()
            try:
                results = await loop.run_in_executor(self._executor, core.runner.execute,
                                                     steps, rows)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any runner failure fails this step only
                core.fail_step(batch, e)
                continue
            core.finish_step(batch, results, time.perf_counter() - t0)
            await asyncio.sleep(0)  # let handlers and the background task run between steps

    async def _background_loop(self) -> None:
        core = self.core
        assert core is not None
        while True:
            await asyncio.sleep(self.background_interval_s)
            try:
                core.background()
            except Exception:  # keep the loop alive; integrity checks will catch real damage
                log.exception("background cache maintenance failed")
