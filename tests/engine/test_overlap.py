"""Overlapped scheduling (``scheduler.overlap``) changes when outputs are built, never what
they are: the same workload with overlap on and off gives identical outputs per request --
text, token ids, finish reasons, logprobs, usage, and the order of each sequence's outputs.

The workload is deterministic: every request is added before the first step, aborts happen
after a fixed number of outputs, and sampled sequences draw from their own seeded stream
(:class:`SeededRunner`), which also produces EOS and logprobs.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from hermes_async.config import CacheConfig, EngineConfig, SchedulerConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.engine.request import RequestOutput, Usage
from hermes_async.step import SampledToken, SequenceStep
from hermes_async.types import FinishReason, SamplingParams
from tests.engine.fake_runner import (
    EOS,
    VOCAB,
    FakeRunner,
    StepFailure,
    fake_output_text,
    next_token,
    reference_tokens,
)
from tests.engine.test_engine_fake import assert_idle

EOS_EVERY = 13  # a sampled token that is a multiple of this reads as EOS


def mix(base: int, draw: int) -> int:
    """A sampled token: the context's token moved by the sequence's own random draw."""
    tok = 3 + (base + draw) % (VOCAB - 3)
    return EOS if tok % EOS_EVERY == 0 else tok


def fake_logprob(tok: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    lp = -((tok * 7919) % 1000) / 100
    return lp, tuple(((tok + k) % VOCAB, lp - k) for k in range(top))


class SeededRunner(FakeRunner):
    """:class:`FakeRunner` whose non-greedy rows with a generator draw from it (one draw per
    sampled token, as a real sampler advances a seeded stream), with logprobs when asked."""

    def new_generator(self, seed: int, stream: int) -> random.Random:  # type: ignore[override]
        return random.Random(seed * 1_000_003 + stream)

    def execute(self, steps: Sequence[SequenceStep]) -> list[SampledToken | None]:
        out = super().execute(steps)
        return [r if r is None or s.sampling is None else self._sample(s, r.token_id)
                for s, r in zip(steps, out, strict=True)]

    @staticmethod
    def _sample(step: SequenceStep, base: int) -> SampledToken:
        row = step.sampling
        assert row is not None
        tok = base
        if isinstance(row.generator, random.Random) and not row.params.greedy:
            tok = mix(base, row.generator.randrange(VOCAB))
            if tok in row.banned_token_ids:
                tok = 3
        if not row.params.logprobs:
            return SampledToken(tok)
        lp, top = fake_logprob(tok, row.params.top_logprobs)
        return SampledToken(tok, lp, top)


class FailAt(SeededRunner):
    """Fails exactly the given (1-based) steps."""

    def __init__(self, fail_steps: set[int], **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.fail_steps = fail_steps

    def execute(self, steps: Sequence[SequenceStep]) -> list[SampledToken | None]:
        if self.steps + 1 in self.fail_steps:
            self.steps += 1
            self.failures += 1
            raise StepFailure("injected runner failure")
        return super().execute(steps)


def seeded_stream(prompt: list[int], seed: int, stream: int, n: int,
                  ignore_eos: bool = False) -> list[int]:
    """What :class:`SeededRunner` samples for sequence ``stream`` of a seeded request (no
    ``min_tokens``), cut after the first EOS unless ``ignore_eos``."""
    gen, ctx, out = random.Random(seed * 1_000_003 + stream), list(prompt), []
    for _ in range(n):
        tok = mix(next_token(ctx), gen.randrange(VOCAB))
        out.append(tok)
        if tok == EOS and not ignore_eos:
            break
        ctx.append(tok)
    return out


def span_stop(a: int, b: int) -> str:
    """A stop string across two tokens' texts (``<a><b>``): the end of one, the start of the
    next."""
    return f"{str(a)[-1]}><{str(b)[0]}"


@dataclass(frozen=True)
class Job:
    rid: str
    prompt: list[int]
    params: SamplingParams
    abort_after: int | None = None  # abort once this many outputs arrived (0: before a step)


def workload(max_model_len: int = 512) -> list[Job]:
    """The jobs; "model-context" (no ``max_tokens``) is 32 tokens short of ``max_model_len``."""
    rng = random.Random(14)
    system = [rng.randrange(3, 900) for _ in range(16)]

    def prompt(k: int) -> list[int]:
        return system + [rng.randrange(3, 900) for _ in range(k)]

    def greedy(**kw: object) -> SamplingParams:
        return SamplingParams(temperature=0.0, **kw)  # type: ignore[arg-type]

    jobs = [Job("greedy-length", prompt(3), greedy(max_tokens=24))]
    p = prompt(5)
    ref = reference_tokens(p, 30)
    jobs.append(Job("stop-token-text", p, greedy(max_tokens=30, stop=(f"<{ref[7]}>",))))
    p = prompt(2)
    ref = reference_tokens(p, 30)
    jobs.append(Job("stop-across-tokens", p, greedy(max_tokens=30,
                                                    stop=(span_stop(ref[4], ref[5]),))))
    p = prompt(4)
    ref = reference_tokens(p, 30)
    jobs.append(Job("stop-token-id", p, greedy(max_tokens=30, stop_token_ids=(ref[6],))))
    p = prompt(6)
    ref = reference_tokens(p, 10)
    jobs.append(Job("stop-on-last", p, greedy(max_tokens=10, stop=(f"<{ref[9]}>",))))
    p = prompt(7)
    stream1 = seeded_stream(p, 11, 1, 16)
    jobs.append(Job("n3-seeded-logprobs", p, SamplingParams(
        n=3, seed=11, temperature=0.9, top_logprobs=2, max_tokens=16,
        stop=(f"<{stream1[5]}>",))))
    jobs.append(Job("n2-min-tokens-eos", prompt(3), SamplingParams(
        n=2, seed=5, temperature=1.0, min_tokens=4, max_tokens=40)))
    jobs.append(Job("seeded-eos", prompt(8), SamplingParams(seed=8, max_tokens=40)))
    jobs.append(Job("one-token", prompt(1), SamplingParams(seed=3, temperature=0.7,
                                                           max_tokens=1)))
    p = prompt(9)
    stream0 = seeded_stream(p, 21, 0, 30, ignore_eos=True)
    jobs.append(Job("ignore-eos-stop", p, SamplingParams(
        seed=21, ignore_eos=True, max_tokens=30, stop=(span_stop(stream0[7], stream0[8]),))))
    jobs.append(Job("model-context", [rng.randrange(3, 900) for _ in range(max_model_len - 32)],
                    greedy(max_tokens=None)))
    jobs.append(Job("abort-after-3", prompt(2), greedy(max_tokens=40), abort_after=3))
    jobs.append(Job("n2-abort-after-5", prompt(3), SamplingParams(
        n=2, seed=9, max_tokens=40), abort_after=5))
    jobs.append(Job("abort-at-once", prompt(2), greedy(max_tokens=40), abort_after=0))
    return jobs


def make_engine(overlap: bool, runner: FakeRunner | None = None, num_blocks: int = 1024,
                budget: int = 1024, max_seqs: int = 32,
                background_eviction: bool = True) -> AsyncEngine:
    """``background_eviction=False``: watermarks at 1.0, so blocks are evicted only when an
    allocation needs them, at the same step with and without overlap (the background task's
    timing decides nothing)."""
    marks = {} if background_eviction else dict(high_watermark=1.0, low_watermark=1.0)
    cfg = EngineConfig(cache=CacheConfig(block_size=4, **marks),
                       scheduler=SchedulerConfig(max_num_seqs=max_seqs,
                                                 max_num_batched_tokens=budget,
                                                 overlap=overlap))
    runner = runner or SeededRunner(num_blocks=num_blocks)
    return AsyncEngine(cfg, runner=runner, tokenizer=object(),
                       eos_token_ids=[EOS], output_text=fake_output_text,
                       background_interval_s=0.001)


Outcome = dict[int, list[RequestOutput]]  # a request's outputs per sequence, in order


async def consume(engine: AsyncEngine, job: Job, queue: asyncio.Queue) -> Outcome:
    """The request's outputs up to the one with usage (which must be the last), aborting it
    after ``job.abort_after`` outputs."""
    by_index: Outcome = {}
    seen = 0
    while True:
        out = await queue.get()
        by_index.setdefault(out.index, []).append(out)
        seen += 1
        if seen == job.abort_after:
            engine.abort(job.rid)
        if out.usage is not None:
            assert queue.empty(), f"{job.rid}: output after the one with usage"
            return by_index


async def run_jobs(engine: AsyncEngine, jobs: list[Job], suffix: str = "") -> dict[str, Outcome]:
    """Add every job before the first step (one synchronous burst), then collect."""
    jobs = [Job(j.rid + suffix, j.prompt, j.params, j.abort_after) for j in jobs]
    reqs = [engine.add_request(j.prompt, j.params, request_id=j.rid) for j in jobs]
    for j in jobs:
        if j.abort_after == 0:
            engine.abort(j.rid)
    outs = await asyncio.gather(*(consume(engine, j, r.queue)
                                  for j, r in zip(jobs, reqs, strict=True)))
    return {j.rid: o for j, o in zip(jobs, outs, strict=True)}


def check_sequence_outputs(rid: str, outs: list[RequestOutput]) -> None:
    """One final output, last; nothing after a stop."""
    finals = [o for o in outs if o.finish_reason is not None]
    assert len(finals) == 1 and outs[-1] is finals[0], rid


async def run_workload(overlap: bool, **kw: object) -> tuple[dict[str, Outcome], AsyncEngine]:
    engine = make_engine(overlap, **kw)  # type: ignore[arg-type]
    async with engine:
        jobs = workload(engine.max_model_len)
        first = await run_jobs(engine, jobs)
        again = await run_jobs(engine, jobs, "-again")  # now hitting the cached prompts
        await asyncio.sleep(0.01)
        assert_idle(engine)
    results = first | again
    for rid, outcome in results.items():
        for outs in outcome.values():
            check_sequence_outputs(rid, outs)
    return results, engine


def usage_of(outcome: Outcome) -> Usage:
    """The usage of the request (on exactly one output)."""
    (usage,) = [o.usage for outs in outcome.values() for o in outs if o.usage is not None]
    return usage


def without_cached_tokens(outcome: Outcome) -> Outcome:
    """The same outputs with the usage's ``cached_tokens`` zeroed."""
    return {i: [o if o.usage is None else replace(o, usage=replace(o.usage, cached_tokens=0))
                for o in outs] for i, outs in outcome.items()}


VARIANTS = {
    "roomy": {},  # everything admitted at once
    "tight": dict(budget=24, max_seqs=6),  # chunked prefills, a queue, a step cap
    # ... and a pool that preempts and evicts, smaller than the runner's context: it caps
    # max_model_len to its 400 tokens, which "model-context" fills (the others preempted for
    # it): blocks are evicted only when an allocation needs them (no background timing, so
    # the preemptions always happen); which blocks the second wave still finds cached may
    # differ with overlap (a step planned before the last one's blocks were committed), so
    # cached_tokens may differ
    "preempting": dict(num_blocks=100, budget=24, max_seqs=6, background_eviction=False),
}


@pytest.mark.parametrize("variant", VARIANTS)
async def test_overlap_on_and_off_give_identical_outputs(variant):
    off, engine_off = await run_workload(False, **VARIANTS[variant])
    on, engine_on = await run_workload(True, **VARIANTS[variant])
    assert on.keys() == off.keys()
    if variant == "preempting":
        for engine in (engine_off, engine_on):
            assert "hermes_preemptions_total 0.0" not in engine.metrics.exposition().decode()
        on = {rid: without_cached_tokens(o) for rid, o in on.items()}
        off = {rid: without_cached_tokens(o) for rid, o in off.items()}
    for rid in off:
        assert on[rid] == off[rid], rid  # every output, in order, field by field
        assert usage_of(on[rid]) == usage_of(off[rid]), rid
    reasons = {o[-1].finish_reason for outcome in off.values() for o in outcome.values()}
    assert reasons == {FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT}
    (outs,) = off["model-context"].values()  # at the (capped) context: length, no error
    assert outs[-1].finish_reason is FinishReason.LENGTH
    assert usage_of(off["model-context"]).completion_tokens == 32
    # the stop strings fired mid-stream, and EOS ended some sampled sequences
    for rid in ("stop-token-text", "stop-across-tokens", "ignore-eos-stop"):
        (outs,) = off[rid].values()
        assert outs[-1].finish_reason is FinishReason.STOP and len(outs) < 29, rid
    eos_ended = [outs for rid in ("seeded-eos", "n2-min-tokens-eos")
                 for outs in off[rid].values() if outs[-1].finish_reason is FinishReason.STOP]
    assert eos_ended and all(outs[-1].token_ids == () for outs in eos_ended)
    # min_tokens held EOS back for the first 4 tokens of each sequence
    assert usage_of(off["n2-min-tokens-eos"]).completion_tokens >= 8
    if variant != "preempting":
        assert usage_of(off["greedy-length-again"]).cached_tokens == 16


async def test_greedy_outputs_match_the_reference_with_overlap():
    results, _ = await run_workload(True)
    for rid in ("greedy-length", "greedy-length-again"):
        (outs,) = results[rid].values()
        job = next(j for j in workload() if rid.startswith(j.rid))
        assert [t for o in outs for t in o.token_ids] == reference_tokens(job.prompt, 24)
    (outs,) = results["model-context"].values()
    assert outs[-1].finish_reason is FinishReason.LENGTH
    assert usage_of(results["model-context"]).completion_tokens == 512 - 480


async def run_with_failure(overlap: bool, jobs: list[Job],
                           fail_steps: set[int]) -> tuple[dict[str, Outcome], AsyncEngine]:
    engine = make_engine(overlap, runner=FailAt(fail_steps, num_blocks=256))
    async with engine:
        results = await run_jobs(engine, jobs)
        assert_idle(engine)
    return results, engine


async def test_failing_step_after_a_stop_string_fails_only_the_live_requests():
    """A stop string ends ``stops`` in the emit of step 5 while step 6 (which includes it) is in
    flight; step 6 fails: ``stops`` keeps its clean stop, ``goes-on`` gets its step-5 token
    and then the error -- the same as without overlap, where step 6 never includes ``stops``."""
    prompt_a, prompt_b = [5, 6, 7, 8, 9], [11, 12, 13]
    ref = reference_tokens(prompt_a, 10)
    jobs = [Job("stops", prompt_a, SamplingParams(temperature=0, max_tokens=10,
                                                  stop=(f"<{ref[4]}>",))),
            Job("goes-on", prompt_b, SamplingParams(temperature=0, max_tokens=10))]
    by_mode = {}
    for overlap in (False, True):
        results, engine = await run_with_failure(overlap, jobs, {6})
        by_mode[overlap] = results
        (stops,) = results["stops"].values()
        assert [t for o in stops for t in o.token_ids] == ref[:5]  # with the stop's token
        assert stops[-1].finish_reason is FinishReason.STOP and stops[-1].error is None
        (goes_on,) = results["goes-on"].values()
        assert [t for o in goes_on for t in o.token_ids] == reference_tokens(prompt_b, 5)
        assert goes_on[-1].finish_reason is FinishReason.ERROR and goes_on[-1].error
        assert 'hermes_request_errors_total{code="engine_error"} 1.0' in \
            engine.metrics.exposition().decode()
    assert by_mode[True] == by_mode[False]


async def test_pool_too_small_delivers_the_last_token_before_the_error():
    """A lone sequence outgrows what operator pins leave of the pool (max_model_len is capped
    to the whole pool, pinned blocks included): the plan that finds it unfittable runs before
    the previous step's deferred emit; its token must still come first, then the error."""
    pinned = list(range(100, 117))  # 4 full blocks, pinned: half of the 8-block pool
    prompt = list(range(20, 28))
    jobs = [Job("outgrows", prompt, SamplingParams(temperature=0, max_tokens=20))]  # 28 <= 32
    by_mode = {}
    for overlap in (False, True):
        engine = make_engine(overlap, runner=SeededRunner(num_blocks=8))  # 32 tokens at most
        async with engine:
            assert engine.max_model_len == 32
            warmed = await engine.warm(token_ids=pinned, namespace="pins", pin_ttl_s=600)
            assert warmed.pin is not None and warmed.pin["blocks"] == 4
            by_mode[overlap] = await run_jobs(engine, jobs)
            engine.reset_cache("pins")  # unpinned
            assert_idle(engine)
        (outs,) = by_mode[overlap]["outgrows"].values()
        assert outs[-1].finish_reason is FinishReason.ERROR
        assert [t for o in outs for t in o.token_ids] == reference_tokens(prompt, 9)
        assert usage_of(by_mode[overlap]["outgrows"]).completion_tokens == 9
    assert by_mode[True] == by_mode[False]


async def run_counting_steps(engine: AsyncEngine, job: Job) -> tuple[Outcome, int]:
    """Run ``job``, then a one-step request, which is planned only after any forward still in
    flight for ``job`` is back: the forwards run, counted deterministically."""
    results = await run_jobs(engine, [job])
    await run_jobs(engine, [Job("tail", [7, 7, 7], SamplingParams(max_tokens=1))])
    return results[job.rid], engine.runner.steps - 1


async def test_overlap_drops_the_in_flight_result_of_a_stopped_sequence():
    """With overlap the step after a stop string still computes the stopped sequence (the
    wasted slot), yet nothing of it is streamed or counted."""
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    ref = reference_tokens(prompt, 12)
    params = SamplingParams(temperature=0, max_tokens=12, stop=(f"<{ref[3]}>",))
    steps = {}
    for overlap in (False, True):
        async with make_engine(overlap) as engine:
            outcome, steps[overlap] = await run_counting_steps(engine, Job("r", prompt, params))
        (outs,) = outcome.values()
        assert [t for o in outs for t in o.token_ids] == ref[:4]  # the stop's token too
        assert usage_of(outcome).completion_tokens == 4
        assert "".join(o.text for o in outs) == "".join(f"<{t}>" for t in ref[:3])
    assert steps == {False: 4, True: 5}


@pytest.mark.parametrize("end", ["max_tokens", "stop_token_id", "model_context"])
async def test_no_step_is_spent_on_a_sequence_that_ids_or_lengths_end(end):
    """EOS, stop token ids, ``max_tokens`` and the model's context end a sequence at commit,
    before the next plan: overlap runs exactly the steps the sequential loop runs."""
    prompt = [2 + k for k in range(1, 9)]
    ref = reference_tokens(prompt, 12)
    params = {"max_tokens": SamplingParams(temperature=0, max_tokens=4),
              "stop_token_id": SamplingParams(temperature=0, max_tokens=12,
                                              stop_token_ids=(ref[3],)),
              "model_context": SamplingParams(temperature=0, max_tokens=None)}[end]
    steps = {}
    for overlap in (False, True):
        max_len = len(prompt) + 4 if end == "model_context" else 512
        runner = SeededRunner(num_blocks=64, max_model_len=max_len)
        async with make_engine(overlap, runner=runner) as engine:
            outcome, steps[overlap] = await run_counting_steps(engine, Job("r", prompt, params))
        assert usage_of(outcome).completion_tokens == 4
    assert steps == {False: 4, True: 4}
