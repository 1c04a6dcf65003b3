"""The engine's synchronous core: requests in, steps planned, results turned into outputs.

Everything here runs on the event loop that owns the engine (no locks): ``plan_step`` picks
the next batch, the async wrapper runs ``runner.execute`` in its worker thread, then a step's
results are applied in two parts:

- ``commit_step`` (cheap, before the next plan): computed lengths, newly full blocks, the
  sampled tokens, and every sequence that a token id or a length ends (EOS, stop token ids,
  ``max_tokens``, the model's context) leaves the scheduler, so no step is spent on it;
- ``emit_deferred`` (the costly Python): each committed token through the sequence's
  detokenizer and stop strings, a :class:`RequestOutput` on the request's queue, latencies.
  With overlapped scheduling it runs while the next step's forward does; a stop string found
  there ends its sequence like an abort (that step's result for it is dropped).

``finish_step`` is both at once; ``fail_step`` fails a step whose forward raised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from hermes_async.cache.disk_tier import DiskTier
from hermes_async.cache.manager import KVCacheManager
from hermes_async.cache.pins import PinLimitError
from hermes_async.config import CacheConfig, EngineConfig
from hermes_async.engine.drafts import Drafter
from hermes_async.engine.parts import OutputTextFactory
from hermes_async.engine.request import (
    GRAMMAR_REJECTED,
    EngineRequest,
    RequestOutput,
    Sequence,
    TokenLogprob,
)
from hermes_async.engine.scheduler import Drafting, ScheduledBatch, Scheduler
from hermes_async.metrics import EngineMetrics
from hermes_async.observe.cache_observer import CacheObserver
from hermes_async.step import SampledToken, SamplingRequest, StepRunner, min_tokens_ban
from hermes_async.types import FinishReason

log = logging.getLogger("hermes_async.engine")


def bad_words_ban(bad_words_ids: tuple[tuple[int, ...], ...],
                  output_ids: list[int]) -> frozenset[int]:
    """vLLM's ``bad_words`` rule: a word's last token is banned when the output ends with the
    word's other tokens (a one-token word is always banned)."""
    banned = set()
    for ids in bad_words_ids:
        head = len(ids) - 1
        if head == 0 or (len(output_ids) >= head and tuple(output_ids[-head:]) == ids[:-1]):
            banned.add(ids[-1])
    return frozenset(banned)


def served_max_model_len(runner: StepRunner) -> int:
    """The longest sequence (prompt + completion) the engine serves: the runner's
    ``max_model_len``, capped to what the KV pool holds (``num_blocks * block_size`` tokens).

    A sequence of that length fits the pool alone (it computes at most one token less), so a
    request the context checks accept is never failed for want of blocks mid-generation:
    others are preempted for it, and without ``max_tokens`` it ends with ``length`` at this
    limit. (Operator pins hold blocks too: a pool mostly pinned can still be too small.) The
    one rule behind ``AsyncEngine.max_model_len``, ``add_request``'s context check and the
    context end of a sequence."""
    return min(runner.max_model_len, runner.num_blocks * runner.block_size)


class TokenEnd(Enum):
    """Why a committed token ends its sequence, as far as ids and lengths tell (stop strings
    need the text: they are found when the token is emitted)."""

    STOP_ID = "stop_id"
    """EOS (unless ``ignore_eos``) or a stop token id: finish reason stop, the id not streamed."""
    LENGTH = "length"
    """``max_tokens`` or the model's context: finish reason length -- stop if a stop string
    matches the text released at the end."""
    COMPLETE = "complete"
    """The structured-output grammar is complete: finish reason stop, the token streamed."""
    REJECTED = "rejected"
    """The grammar rejected the token (only when bans, ``allowed_token_ids`` or bad words
    left no token it allows): finish reason error, the token not streamed."""


@dataclass(frozen=True, slots=True)
class PendingToken:
    """A token committed to ``seq.tokens`` whose output is not built yet; ``end`` is set when
    the sequence already left the scheduler because of it."""

    seq: Sequence
    sampled: SampledToken
    end: TokenEnd | None
    length: int = 0  # len(seq.tokens) up to this token (after drafts, more may follow it)


class EngineCore:
    """Scheduler + KV cache manager + request table over one :class:`StepRunner`."""

    def __init__(self, config: EngineConfig, runner: StepRunner, eos_token_ids: frozenset[int],
                 output_text: OutputTextFactory, metrics: EngineMetrics,
                 observer: CacheObserver, wake: Callable[[], None] | None = None) -> None:
        self.config = config
        self.runner = runner
        self.eos_token_ids = eos_token_ids
        self.output_text = output_text
        self.metrics = metrics
        self.observer = observer
        self.cache = KVCacheManager.from_config(config.cache, runner.num_blocks,
                                                runner.block_size)
        if config.cache.disk_dir is not None:
            self._attach_disk(config.cache, wake)
        self.max_model_len = served_max_model_len(runner)
        if self.max_model_len < runner.max_model_len:
            cache = config.cache
            budget = (f"kv_cache_bytes={cache.kv_cache_bytes}" if cache.kv_cache_bytes is not None
                      else f"kv_cache_memory_fraction={cache.kv_cache_memory_fraction}")
            log.warning("max_model_len capped to %d tokens by the KV pool (%s: %d blocks of %d "
                        "tokens; the model's context is %d)", self.max_model_len, budget,
                        runner.num_blocks, runner.block_size, runner.max_model_len)
        spec = config.speculative
        self.drafter = Drafter(spec) if spec.enabled else None
        drafting = Drafting(self._propose, spec.max_batch_seqs) if spec.enabled else None
        self.scheduler = Scheduler(config.scheduler, self.cache, self._sampling_request,
                                   drafting=drafting)
        self.requests: dict[str, EngineRequest] = {}
        self._deferred: list[PendingToken] = []  # committed, not emitted yet (commit order)

    # ----- requests -------------------------------------------------------------------------
    def add(self, req: EngineRequest) -> None:
        """Register a validated request and queue its sequences."""
        for i in range(req.params.n):
            seq_id = req.request_id if req.params.n == 1 else f"{req.request_id}#{i}"
            generator = None  # unseeded sequences draw from the sampler's shared stream
            if req.params.seed is not None:
                generator = self.runner.new_generator(req.params.seed, i)
            seq = Sequence(seq_id, req, i, list(req.prompt_ids), len(req.prompt_ids),
                           self.output_text(req.prompt_ids, req.params.stop), generator,
                           req.grammar.new_constraint() if req.grammar is not None else None)
            req.sequences.append(seq)
            self.scheduler.add(seq)
        self.requests[req.request_id] = req
        self.metrics.prompt_tokens.labels(req.namespace).inc(len(req.prompt_ids))

    def abort(self, request_id: str) -> bool:
        """Abort at once: its deferred tokens are emitted first, then blocks released now (safe
        mid-step: nothing allocates until the next plan, and the step's results for it are
        dropped). False if unknown or finished."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        self._emit_deferred_of(req)
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

    def commit_step(self, batch: ScheduledBatch, results: list[SampledToken | None],
                    seconds: float) -> None:
        """Apply the cheap part of a step, before the next plan: advance computed lengths,
        cache newly full blocks, append each sampled token, and take out of the scheduler each
        sequence that EOS, a stop token id, ``max_tokens`` or the model's context ends (a
        warm-up's prompt pinned first), so no later step includes it. The tokens wait, in
        order, for :meth:`emit_deferred` (due before the next commit: the step loop calls it
        right after launching the next forward, or at once). Sequences that left the running
        set during the step (aborted, or ended by a stop string while it ran) are skipped:
        their result is dropped."""
        self.metrics.step_seconds.observe(seconds)
        self.metrics.step_tokens.observe(batch.num_tokens)
        self.metrics.step_seqs.observe(len(batch.steps))
        if self.drafter is not None and not batch.num_prefill_tokens:
            # decodes and their drafts only: what drafting decides on (a prefill chunk's
            # hundreds of tokens run at a GEMM's rate and would skew the fit)
            self.drafter.cost.observe(batch.num_tokens, seconds)
        tokens = [None if r is None else tuple(t.token_id for t in r.tokens) for r in results]
        for i in self.scheduler.update_from_output(batch, tokens):
            sampled, seq, step = results[i], batch.seqs[i], batch.steps[i]
            assert sampled is not None
            new = sampled.tokens
            if step.num_drafts:
                self._count_drafts(seq, step.num_drafts, len(new) - 1)
            before = len(seq.tokens) - len(new)
            for j, one in enumerate(new):
                end = self._token_end(seq, one.token_id, before + j + 1)
                if end is not None:  # the tokens verification kept after it are dropped
                    del seq.tokens[before + j + 1:]
                    seq.num_computed = min(seq.num_computed, len(seq.tokens))
                    self._retire(seq, pin=True)  # reason stop or length: a warm-up pins
                self._deferred.append(PendingToken(seq, one, end, before + j + 1))
                if end is not None:
                    break
        self.update_gauges()

    def emit_deferred(self) -> None:
        """Apply the costly part of the committed steps, in commit order: each token through
        its sequence's output text (incremental detokenizer, stop strings), its
        :class:`RequestOutput` queued (the last one with the finish reason and, for the
        request's last sequence, the usage), TTFT and ITL observed. A stop string ends its
        sequence here: blocks released at once, and a step already in flight drops its result
        for it. No-op when nothing is deferred."""
        if not self._deferred:
            return
        pending, self._deferred = self._deferred, []
        self._emit(pending)

    def finish_step(self, batch: ScheduledBatch, results: list[SampledToken | None],
                    seconds: float) -> None:
        """Apply a step at once (sequential scheduling): :meth:`commit_step` then
        :meth:`emit_deferred`."""
        self.commit_step(batch, results, seconds)
        self.emit_deferred()

    def fail_step(self, batch: ScheduledBatch, error: BaseException) -> None:
        """A forward raised: fail the requests of this step whose sequences were still running
        in it (not those aborted or ended by a stop string while it ran); the loop goes on."""
        live = [seq for seq in batch.seqs if not seq.is_finished]
        log.exception("forward step failed; failing %d sequence(s)", len(live),
                      exc_info=error)
        for req in {id(seq.request): seq.request for seq in live}.values():
            self._fail_request(req, f"model execution failed: {error}", "engine_error")

    def background(self) -> None:
        """Expired pins, eviction to the low watermark, fork-limit pruning and finished disk
        loads (between steps)."""
        self.cache.finish_loads()
        self.cache.expire_pins()
        evicted = self.cache.evict_to_low_watermark()
        if evicted:
            self.metrics.evicted_blocks.inc(evicted)
        pruned = self.cache.prune_forks()
        if pruned:
            self.metrics.pruned_nodes.inc(pruned)

    def close(self) -> None:
        """The engine stops: with a disk tier, the cached blocks go to disk (bounded by
        ``cache.disk_shutdown_s``)."""
        self.cache.close_disk(self.config.cache.disk_shutdown_s)

    # ----- internals --------------------------------------------------------------------------
    def _attach_disk(self, cache: CacheConfig, wake: Callable[[], None] | None) -> None:
        io = getattr(self.runner, "kv_blocks", None)
        if io is None:
            log.warning("cache.disk_dir is set, but this runner cannot copy KV blocks: no disk "
                        "tier")
            return
        tier = DiskTier.open(cache.disk_dir, cache.disk_bytes, io,  # type: ignore[arg-type]
                             block_size=self.runner.block_size,
                             backlog_bytes=cache.disk_backlog_bytes, notify=wake)
        if tier is not None:
            self.cache.attach_disk(tier, write_through=cache.disk_write_through)
            st = tier.stats()
            log.info("KV disk tier in %s: %d blocks (%.1f MiB) of at most %.1f MiB, %d bytes "
                     "per block", tier.root, st.blocks, st.bytes / 2**20, st.max_bytes / 2**20,
                     tier.file_bytes)

    def _sampling_request(self, seq: Sequence, ahead: tuple[int, ...] = ()) -> SamplingRequest:
        """``seq``'s sampling inputs for its next token, or, with ``ahead`` (drafted tokens),
        for the token after them as if they were its output already (penalties, ``min_tokens``
        and bad words see them)."""
        p = seq.request.params
        output_ids = seq.output_ids + list(ahead) if ahead else seq.output_ids
        banned = min_tokens_ban(p, len(output_ids), self.eos_token_ids)
        if seq.request.bad_words_ids:
            banned = banned | bad_words_ban(seq.request.bad_words_ids, output_ids)
        prompt = seq.tokens[:seq.num_prompt_tokens] if p.repetition_penalty != 1.0 else ()
        output = output_ids if (p.repetition_penalty != 1.0 or p.frequency_penalty
                                or p.presence_penalty) else ()
        constraint = seq.constraint
        if ahead and constraint is not None:
            constraint = constraint.ahead(ahead)  # the mask after the drafts
        return SamplingRequest(p, prompt, output, seq.generator, banned, constraint)

    def _propose(self, seq: Sequence, decodes: int) -> tuple[int, ...]:
        """The drafted tokens to follow ``seq``'s last one (see :class:`Drafter`), never past
        ``max_tokens`` or the context (no overshoot)."""
        assert self.drafter is not None
        p = seq.request.params
        most = min(self.config.speculative.num_tokens, self.max_model_len - len(seq.tokens))
        if p.max_tokens is not None:
            most = min(most, p.max_tokens - seq.num_output_tokens - 1)
        return self.drafter.propose(seq, most, decodes) if most > 0 else ()

    def _count_drafts(self, seq: Sequence, drafted: int, accepted: int) -> None:
        assert self.drafter is not None
        self.drafter.verified(seq, drafted, accepted)
        m = self.metrics
        m.spec_drafts.inc()
        m.spec_draft_tokens.inc(drafted)
        m.spec_accepted_tokens.inc(accepted)
        for position in range(accepted):
            m.spec_accepted_per_pos.labels(str(position)).inc()

    def _record_admission(self, seq: Sequence) -> None:
        """A first admission: the one place prefix-cache hits are counted (the observer's
        figures feed both ``/metrics`` and ``/cache/stats``)."""
        ns = seq.request.namespace
        matched = seq.cached_tokens or 0
        self.metrics.prefix_matched.labels(ns).observe(matched)
        self.observer.on_admission(ns, seq.tokens[:seq.num_prompt_tokens], matched,
                                   seq.disk_tokens)
        log.debug("request %s admitted: start_position=%d of %d prompt tokens", seq.seq_id,
                  matched, seq.num_prompt_tokens)

    def _token_end(self, seq: Sequence, token: int, length: int) -> TokenEnd | None:
        """Whether ``token`` (appended to ``seq.tokens``, which it makes ``length`` long) ends
        ``seq`` without looking at its text."""
        p = seq.request.params
        if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
            return TokenEnd.STOP_ID
        if seq.constraint is not None:
            if not seq.constraint.accept(token):
                return TokenEnd.REJECTED
            if seq.constraint.is_finished:
                return TokenEnd.COMPLETE
        if (p.max_tokens is not None and length - seq.num_prompt_tokens >= p.max_tokens) or \
                length >= self.max_model_len:
            return TokenEnd.LENGTH
        return None

    def _emit(self, pending: list[PendingToken]) -> None:
        now = time.monotonic()
        for item in pending:
            if not item.seq.is_done:  # else ended meanwhile (abort, failure): nothing follows
                self._on_token(item, now)

    def _emit_deferred_of(self, req: EngineRequest) -> None:
        """Emit ``req``'s deferred tokens now, before it is aborted or failed (the others stay
        deferred): its outputs keep their order and none follows a sequence's last."""
        mine = [item for item in self._deferred if item.seq.request is req]
        if mine:
            self._deferred = [item for item in self._deferred if item.seq.request is not req]
            self._emit(mine)

    def _observe_latency(self, seq: Sequence, now: float) -> None:
        """TTFT (of a request's first sequence) or ITL, as the token's output is queued."""
        if seq.first_token_time is None:
            seq.first_token_time = now
            if seq.index == 0:
                self.metrics.ttft.observe(now - seq.request.arrival_time)
        elif seq.last_token_time is not None:
            self.metrics.itl.observe(now - seq.last_token_time)
        seq.last_token_time = now

    @staticmethod
    def _text_of(seq: Sequence, token: int,
                 end: TokenEnd | None) -> tuple[FinishReason | None, str, tuple[int, ...]]:
        """The token's text delta, the finish reason it brings (None: the sequence goes on)
        and the ids to stream (an EOS or stop token id is not streamed)."""
        if end is TokenEnd.STOP_ID:
            return FinishReason.STOP, seq.output_text.finish().text, ()
        if end is TokenEnd.REJECTED:
            return FinishReason.ERROR, seq.output_text.finish().text, ()
        delta = seq.output_text.append(token)
        if delta.stopped:
            return FinishReason.STOP, delta.text, (token,)
        if end in (TokenEnd.LENGTH, TokenEnd.COMPLETE):
            tail = seq.output_text.finish()  # a stop string may still match held-back text
            done = tail.stopped or end is TokenEnd.COMPLETE
            reason = FinishReason.STOP if done else FinishReason.LENGTH
            return reason, delta.text + tail.text, (token,)
        return None, delta.text, (token,)

    def _on_token(self, item: PendingToken, now: float) -> None:
        seq, sampled = item.seq, item.sampled
        req, p = seq.request, seq.request.params
        self._observe_latency(seq, now)
        self.metrics.generation_tokens.labels(req.namespace).inc()
        reason, text, emitted_ids = self._text_of(seq, sampled.token_id, item.end)
        if reason is not None and item.length and len(seq.tokens) > item.length:
            # a stop string in a token verification kept others after: they are not output
            self._retire(seq, pin=True)
            del seq.tokens[item.length:]
            seq.num_computed = min(seq.num_computed, item.length)
        logprobs: tuple[TokenLogprob, ...] = ()
        if p.logprobs and sampled.logprob is not None:
            logprobs = (TokenLogprob(sampled.token_id, sampled.logprob, sampled.top_logprobs),)
        if reason is None:  # every new token is streamed, even when its text is held back
            req.queue.put_nowait(RequestOutput(req.request_id, seq.index, text, emitted_ids,
                                               logprobs=logprobs))
        elif item.end is TokenEnd.REJECTED:
            assert seq.constraint is not None
            error = (f"the structured-output grammar rejected token {sampled.token_id} "
                     f"({seq.constraint.error}): bans, allowed_token_ids or bad_words left no "
                     "token the grammar allows")
            log.warning("%s: %s", seq.seq_id, error)
            self.metrics.request_errors.labels(GRAMMAR_REJECTED).inc()
            self._finish(seq, reason, text, error=error, error_code=GRAMMAR_REJECTED)
        else:
            self._finish(seq, reason, text, emitted_ids, logprobs)

    def _retire(self, seq: Sequence, pin: bool) -> None:
        """Take ``seq`` out of the scheduler and release its blocks; with ``pin``, a warm-up
        request's cached prompt is pinned first."""
        if pin and seq.request.pin_ttl_s is not None and seq.seq_id in self.cache:
            self._pin(seq)
        self.scheduler.remove(seq)

    def _finish(self, seq: Sequence, reason: FinishReason, text: str,
                token_ids: tuple[int, ...] = (), logprobs: tuple[TokenLogprob, ...] = (),
                error: str | None = None, error_code: str | None = None) -> None:
        """Queue ``seq``'s last output (retiring it first if a commit has not already)."""
        req = seq.request
        if not seq.is_finished:
            self._retire(seq, pin=reason in (FinishReason.STOP, FinishReason.LENGTH))
        seq.finish_reason = reason
        if self.drafter is not None and reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.drafter.answered(seq)
        usage = None
        if req.finished:
            usage = req.usage()
            self.requests.pop(req.request_id, None)
            self.metrics.e2e.observe(time.monotonic() - req.arrival_time)
        req.queue.put_nowait(RequestOutput(req.request_id, seq.index, text, token_ids, reason,
                                           usage, logprobs, error, error_code))

    def _pin(self, seq: Sequence) -> None:
        """A warm-up request finished: pin its cached prompt blocks before they are released."""
        req = seq.request
        try:
            req.pin = self.cache.pin_request(seq.seq_id, req.pin_ttl_s)  # type: ignore[arg-type]
        except PinLimitError as e:
            req.pin_error = str(e)

    def _fail_request(self, req: EngineRequest, message: str, code: str) -> None:
        """Fail every sequence of ``req`` not finished yet (its deferred tokens emitted first)."""
        self._emit_deferred_of(req)
        if req.finished:
            return
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
