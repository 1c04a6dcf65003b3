"""The engine's synchronous core: requests in, steps planned, results turned into outputs.

Everything here runs on the event loop that owns the engine (no locks): ``plan_step`` picks
the next batch, the async wrapper runs ``runner.execute`` in its worker thread, then
``finish_step`` (or ``fail_step``) records the results, detokenizes, applies stop rules and
pushes :class:`RequestOutput` to each request's queue.
"""

from __future__ import annotations

import logging
import time

from hermes_async.cache.manager import KVCacheManager
from hermes_async.cache.pins import PinLimitError
from hermes_async.config import EngineConfig
from hermes_async.engine.parts import OutputTextFactory
from hermes_async.engine.request import (
    EngineRequest,
    RequestOutput,
    Sequence,
    TokenLogprob,
)
from hermes_async.engine.scheduler import ScheduledBatch, Scheduler
from hermes_async.metrics import EngineMetrics
from hermes_async.observe.cache_observer import CacheObserver
from hermes_async.step import SampledToken, SamplingRequest, StepRunner, min_tokens_ban
from hermes_async.types import FinishReason

log = logging.getLogger("hermes_async.engine")


class EngineCore:
    """Scheduler + KV cache manager + request table over one :class:`StepRunner`."""

    def __init__(self, config: EngineConfig, runner: StepRunner, eos_token_ids: frozenset[int],
                 output_text: OutputTextFactory, metrics: EngineMetrics,
                 observer: CacheObserver) -> None:
        self.config = config
        self.runner = runner
        self.eos_token_ids = eos_token_ids
        self.output_text = output_text
        self.metrics = metrics
        self.observer = observer
        self.cache = KVCacheManager.from_config(config.cache, runner.num_blocks,
                                                runner.block_size)
        self.scheduler = Scheduler(config.scheduler, self.cache, self._sampling_request)
        self.requests: dict[str, EngineRequest] = {}

    # ----- requests -------------------------------------------------------------------------
    def add(self, req: EngineRequest) -> None:
        """Register a validated request and queue its sequences."""
        for i in range(req.params.n):
            seq_id = req.request_id if req.params.n == 1 else f"{req.request_id}#{i}"
            generator = None  # unseeded sequences draw from the sampler's shared stream
            if req.params.seed is not None:
                generator = self.runner.new_generator(req.params.seed, i)
            seq = Sequence(seq_id, req, i, list(req.prompt_ids), len(req.prompt_ids),
                           self.output_text(req.prompt_ids, req.params.stop), generator)
            req.sequences.append(seq)
            self.scheduler.add(seq)
        self.requests[req.request_id] = req
        self.metrics.prompt_tokens.labels(req.namespace).inc(len(req.prompt_ids))

    def abort(self, request_id: str) -> bool:
        """Abort at once: blocks released now (safe mid-step: nothing allocates until the next
        plan, and the step's results for it are dropped). False if unknown or finished."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        for seq in req.sequences:
            if not seq.is_finished:
                self._finish(seq, FinishReason.ABORT, "")
        return True

    # ----- one step -------------------------------------------------------------------------
    def plan_step(self) -> ScheduledBatch:
        """The next step: ``batch.steps`` is the runner's input as it is."""
        batch = self.scheduler.schedule()
        if batch.num_preempted:
            self.metrics.preemptions.inc(batch.num_preempted)
        if not batch.steps:
            stuck = self.scheduler.pop_unfittable()
            if stuck is not None:  # alone and still no room: the pool is too small for it
                self._fail_request(stuck.request, "the KV cache is too small for this request",
                                   "kv_cache_too_small")
        for seq in batch.first_admissions:
            self._record_admission(seq)
        self.update_gauges()
        return batch

    def finish_step(self, batch: ScheduledBatch, results: list[SampledToken | None],
                    seconds: float) -> None:
        """Apply a step's sampled tokens: detokenize, stop checks, outputs, releases."""
        self.metrics.step_seconds.observe(seconds)
        self.metrics.step_tokens.observe(batch.num_tokens)
        self.metrics.step_seqs.observe(len(batch.steps))
        tokens = [None if r is None else r.token_id for r in results]
        now = time.monotonic()
        for i in self.scheduler.update_from_output(batch, tokens):
            sampled = results[i]
            assert sampled is not None
            self._on_token(batch.seqs[i], sampled, now)
        self.update_gauges()

    def fail_step(self, batch: ScheduledBatch, error: BaseException) -> None:
        """A forward raised: fail the requests of this step only; the loop goes on."""
        log.exception("forward step failed; failing %d sequence(s)", len(batch.seqs),
                      exc_info=error)
        for req in {id(seq.request): seq.request for seq in batch.seqs}.values():
            self._fail_request(req, f"model execution failed: {error}", "engine_error")

    def background(self) -> None:
        """Expired pins, eviction to the low watermark and fork-limit pruning (between
        steps)."""
        self.cache.expire_pins()
        evicted = self.cache.evict_to_low_watermark()
        if evicted:
            self.metrics.evicted_blocks.inc(evicted)
        pruned = self.cache.prune_forks()
        if pruned:
            self.metrics.pruned_nodes.inc(pruned)

    # ----- internals --------------------------------------------------------------------------
    def _sampling_request(self, seq: Sequence) -> SamplingRequest:
        p = seq.request.params
        banned = min_tokens_ban(p, seq.num_output_tokens, self.eos_token_ids)
        prompt = seq.tokens[:seq.num_prompt_tokens] if p.repetition_penalty != 1.0 else ()
        output = seq.output_ids if (p.repetition_penalty != 1.0 or p.frequency_penalty
                                    or p.presence_penalty) else ()
        return SamplingRequest(p, prompt, output, seq.generator, banned)

    def _record_admission(self, seq: Sequence) -> None:
        """A first admission: the one place prefix-cache hits are counted (the observer's
        figures feed both ``/metrics`` and ``/cache/stats``)."""
        ns = seq.request.namespace
        matched = seq.cached_tokens or 0
        self.metrics.prefix_matched.labels(ns).observe(matched)
        self.observer.on_admission(ns, seq.tokens[:seq.num_prompt_tokens], matched)
        log.debug("request %s admitted: start_position=%d of %d prompt tokens", seq.seq_id,
                  matched, seq.num_prompt_tokens)

    def _on_token(self, seq: Sequence, sampled: SampledToken, now: float) -> None:
        req, p = seq.request, seq.request.params
        token = sampled.token_id
        if seq.first_token_time is None:
            seq.first_token_time = now
            if seq.index == 0:
                self.metrics.ttft.observe(now - req.arrival_time)
        elif seq.last_token_time is not None:
            self.metrics.itl.observe(now - seq.last_token_time)
        seq.last_token_time = now
        self.metrics.generation_tokens.labels(req.namespace).inc()
        reason = None
        emitted_ids: tuple[int, ...] = (token,)
        if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
            reason, text, emitted_ids = FinishReason.STOP, seq.output_text.finish().text, ()
        else:
            delta = seq.output_text.append(token)
            text = delta.text
            if delta.stopped:
                reason = FinishReason.STOP
            elif (p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens) or \
                    len(seq.tokens) >= self.runner.max_model_len:
                tail = seq.output_text.finish()  # a stop string may still match held-back text
                reason = FinishReason.STOP if tail.stopped else FinishReason.LENGTH
                text += tail.text
        logprobs: tuple[TokenLogprob, ...] = ()
        if p.logprobs and sampled.logprob is not None:
            logprobs = (TokenLogprob(token, sampled.logprob, sampled.top_logprobs),)
        if reason is None:  # every new token is streamed, even when its text is held back
            req.queue.put_nowait(RequestOutput(req.request_id, seq.index, text, emitted_ids,
                                               logprobs=logprobs))
        else:
            self._finish(seq, reason, text, emitted_ids, logprobs)

    def _finish(self, seq: Sequence, reason: FinishReason, text: str,
                token_ids: tuple[int, ...] = (), logprobs: tuple[TokenLogprob, ...] = (),
                error: str | None = None) -> None:
        req = seq.request
        if req.pin_ttl_s is not None and reason in (FinishReason.STOP, FinishReason.LENGTH) \
                and seq.seq_id in self.cache:
            self._pin(seq)
        self.scheduler.remove(seq)
        seq.finish_reason = reason
        usage = None
        if req.finished:
            usage = req.usage()
            self.requests.pop(req.request_id, None)
            self.metrics.e2e.observe(time.monotonic() - req.arrival_time)
        req.queue.put_nowait(RequestOutput(req.request_id, seq.index, text, token_ids, reason,
                                           usage, logprobs, error))

    def _pin(self, seq: Sequence) -> None:
        """A warm-up request finished: pin its cached prompt blocks before they are released."""
        req = seq.request
        try:
            req.pin = self.cache.pin_request(seq.seq_id, req.pin_ttl_s)  # type: ignore[arg-type]
        except PinLimitError as e:
            req.pin_error = str(e)

    def _fail_request(self, req: EngineRequest, message: str, code: str) -> None:
        req.error = message
        self.metrics.request_errors.labels(code).inc()
        for seq in req.sequences:
            if not seq.is_finished:
                self._finish(seq, FinishReason.ERROR, "", error=message)

    def update_gauges(self) -> None:
        """Set the queue and KV-pool gauges from the current state (each step, each scrape)."""
        m, usage = self.metrics, self.cache.usage()
        m.requests_running.set(len(self.scheduler.running))
        m.requests_waiting.set(len(self.scheduler.waiting))
        m.kv_blocks_total.set(usage.total)
        m.kv_blocks_free.set(usage.free)
        m.kv_blocks_cached.set(usage.cached)
        m.kv_blocks_referenced.set(usage.referenced)
        m.kv_blocks_pinned.set(usage.operator_pinned)
