"""AsyncEngine over the fake runner: every output is checked against the true context."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from hermes_async.config import CacheConfig, EngineConfig, SchedulerConfig
from hermes_async.engine.async_engine import AsyncEngine, QueueFullError
from hermes_async.types import FinishReason, InvalidParameter, SamplingParams
from tests.engine.fake_runner import FakeRunner, fake_output_text, reference_tokens


def make_engine(num_blocks=256, budget=64, max_seqs=16, fail_rate=0.0, prefix=True,
                policy="fcfs", fail_every=0, **sched) -> AsyncEngine:
    cfg = EngineConfig(
        cache=CacheConfig(block_size=4, enable_prefix_caching=prefix, fork_limit=8),
        scheduler=SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget,
                                  policy=policy, **sched),
    )
    runner = FakeRunner(num_blocks=num_blocks, fail_rate=fail_rate, fail_every=fail_every)
    return AsyncEngine(cfg, runner=runner, tokenizer=object(), eos_token_ids=[2],
                       output_text=fake_output_text, background_interval_s=0.001)


async def collect(engine, prompt, params, **kw):
    ids, text, outs = [], "", []
    async for out in engine.generate(token_ids=prompt, params=params, **kw):
        outs.append(out)
        ids.extend(out.token_ids)
        text += out.text
    return ids, text, outs


def assert_idle(engine: AsyncEngine) -> None:
    core = engine.core
    assert not core.scheduler.running and not core.scheduler.waiting
    assert not core.requests
    usage = core.cache.usage()
    assert usage.referenced == 0 and usage.private == 0
    core.cache.check_integrity()


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0.0)


async def test_single_request_matches_reference():
    async with make_engine() as engine:
        prompt = list(range(10, 31))
        ids, text, outs = await collect(engine, prompt, greedy(20))
        assert ids == reference_tokens(prompt, 20)
        assert outs[-1].finish_reason is FinishReason.LENGTH
        assert outs[-1].usage.completion_tokens == 20
        assert text == "".join(f"<{t}>" for t in ids)
        assert_idle(engine)


async def test_concurrent_shared_prefix_requests_hit_the_cache():
    async with make_engine() as engine:
        system = list(range(100, 140))
        prompts = [system + [500 + i, 600 + i] for i in range(16)]
        first = await collect(engine, prompts[0], greedy(8))
        results = await asyncio.gather(*(collect(engine, p, greedy(12)) for p in prompts[1:]))
        assert first[0] == reference_tokens(prompts[0], 8)
        for p, (ids, _, outs) in zip(prompts[1:], results, strict=True):
            assert ids == reference_tokens(p, 12)
            assert outs[-1].usage.cached_tokens == 40  # the 10 full blocks of the system prompt
        assert_idle(engine)


@pytest.mark.parametrize("variant", ["no_prefix_cache", "chunked", "tiny_pool", "cache_aware"])
async def test_outputs_identical_under_scheduling_variants(variant):
    kw = {"no_prefix_cache": dict(prefix=False), "chunked": dict(budget=16),
          "tiny_pool": dict(num_blocks=40), "cache_aware": dict(policy="cache_aware")}[variant]
    rng = random.Random(1)
    shared = [rng.randrange(3, 900) for _ in range(24)]
    prompts = [shared[: rng.randrange(4, 24)] + [rng.randrange(3, 900) for _ in range(
        rng.randrange(1, 30))] for _ in range(16)]
    async with make_engine(**kw) as engine:
        results = await asyncio.gather(*(collect(engine, p, greedy(24)) for p in prompts))
        for p, (ids, _, _) in zip(prompts, results, strict=True):
            assert ids == reference_tokens(p, 24)
        if variant == "tiny_pool":
            assert engine.core.scheduler.num_preemptions > 0
        assert_idle(engine)


async def test_n_sequences_share_the_prompt_blocks():
    async with make_engine() as engine:
        prompt = list(range(200, 233))
        ids_by_index: dict[int, list[int]] = {0: [], 1: [], 2: []}
        last = None
        async for out in engine.generate(token_ids=prompt,
                                         params=SamplingParams(n=3, max_tokens=10,
                                                               temperature=0)):
            ids_by_index[out.index].extend(out.token_ids)
            last = out
        ref = reference_tokens(prompt, 10)
        assert all(v == ref for v in ids_by_index.values())
        assert last.usage.completion_tokens == 30
        stats = engine.cache_stats()["namespaces"]["default"]["prefix"]
        assert stats["hit_tokens"] >= 2 * 32  # siblings matched the prompt's 8 full blocks
        assert_idle(engine)


async def test_stop_token_ids_and_stop_strings():
    async with make_engine() as engine:
        prompt = list(range(50, 60))
        ref = reference_tokens(prompt, 10)
        ids, _, outs = await collect(engine, prompt, SamplingParams(
            max_tokens=10, temperature=0, stop_token_ids=(ref[4],)))
        assert ids == ref[:4] and outs[-1].finish_reason is FinishReason.STOP
        ids, text, outs = await collect(engine, prompt, SamplingParams(
            max_tokens=10, temperature=0, stop=(f"<{ref[6]}>",)))
        assert text == "".join(f"<{t}>" for t in ref[:6])
        assert outs[-1].finish_reason is FinishReason.STOP
        assert_idle(engine)


async def test_breaking_out_aborts_and_releases():
    async with make_engine() as engine:
        prompt = list(range(300, 340))
        gen = engine.generate(token_ids=prompt, params=greedy(200))
        async for _out in gen:
            assert engine.core.cache.usage().referenced + engine.core.cache.usage().private > 0
            break
        await gen.aclose()
        assert_idle(engine)


async def test_cancelling_the_consumer_aborts():
    async with make_engine() as engine:
        started = asyncio.Event()

        async def consume():
            async for _out in engine.generate(token_ids=list(range(20)), params=greedy(400)):
                started.set()
                await asyncio.sleep(0.01)  # a slow client: the request cannot finish first

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        assert_idle(engine)


async def test_limits_raise_typed_errors():
    engine = make_engine(max_waiting=2)
    async with engine:
        with pytest.raises(InvalidParameter) as e:
            engine.add_request(list(range(600)), greedy(1))
        assert e.value.code == "context_length_exceeded"
        with pytest.raises(InvalidParameter) as e:
            engine.add_request(list(range(400)), greedy(200))
        assert e.value.param == "max_tokens"
        engine._wake.clear()  # keep the loop from admitting while we fill the queue
        reqs = [engine.add_request([5, 6, 7], greedy(2)) for _ in range(2)]
        with pytest.raises(QueueFullError):
            engine.add_request([5, 6, 7], greedy(2))
        for r in reqs:
            engine.abort(r.request_id)
        assert_idle(engine)


async def test_a_pool_smaller_than_the_context_caps_max_model_len(caplog):
    """40 blocks of 4 tokens hold 160, less than the runner's 512: the engine serves 160 (and
    says so). A request past it is refused at admission; one without ``max_tokens`` ends with
    ``length`` at 160 (others preempted for it) instead of failing for want of blocks."""
    caplog.set_level(logging.WARNING, logger="hermes_async.engine")
    async with make_engine(num_blocks=40, max_seqs=8) as engine:
        assert (engine.max_model_len, engine.runner.max_model_len) == (160, 512)
        assert ("max_model_len capped to 160 tokens by the KV pool (kv_cache_memory_fraction="
                "0.25: 40 blocks of 4 tokens; the model's context is 512)") in caplog.text
        for prompt_len, max_tokens, param in ((160, 1, "messages"), (100, 61, "max_tokens")):
            with pytest.raises(InvalidParameter) as e:
                engine.add_request(list(range(3, 3 + prompt_len)), greedy(max_tokens))
            assert (e.value.code, e.value.param) == ("context_length_exceeded", param)
        prompt = list(range(10, 110))
        others = [collect(engine, [i, i + 1, i + 2], greedy(30)) for i in range(200, 206)]
        (ids, _, outs), *rest = await asyncio.gather(
            collect(engine, prompt, SamplingParams(temperature=0.0, max_tokens=None)), *others)
        assert ids == reference_tokens(prompt, 60)
        assert outs[-1].finish_reason is FinishReason.LENGTH and outs[-1].error is None
        assert outs[-1].usage.completion_tokens == 60
        for i, (other, _, _) in zip(range(200, 206), rest, strict=True):
            assert other == reference_tokens([i, i + 1, i + 2], 30)
        assert engine.core.scheduler.num_preemptions > 0
        assert "kv_cache_too_small" not in engine.metrics.exposition().decode()
        assert_idle(engine)


async def test_two_engines_in_one_loop():
    async with make_engine() as a, make_engine() as b:
        (ia, _, _), (ib, _, _) = await asyncio.gather(collect(a, [9, 8, 7], greedy(5)),
                                                      collect(b, [9, 8, 7], greedy(5)))
        assert ia == ib == reference_tokens([9, 8, 7], 5)
        assert a.metrics.registry is not b.metrics.registry


async def test_runner_failures_fail_only_their_step():
    async with make_engine(fail_rate=0.3) as engine:
        results = await asyncio.gather(*(collect(engine, [i, i + 1, i + 2], greedy(6))
                                         for i in range(10, 40)))
        errors = [outs for _, _, outs in results if outs[-1].error]
        complete = [(ids, outs) for ids, _, outs in results if not outs[-1].error]
        assert errors and complete
        for ids, _outs in complete:
            assert len(ids) == 6
        assert_idle(engine)


async def test_stop_aborts_in_flight_and_leaves_cache_consistent():
    engine = make_engine()
    await engine.start()
    task = asyncio.create_task(collect(engine, list(range(30)), greedy(400)))
    await asyncio.sleep(0.02)
    core = engine.core
    await engine.stop()
    ids, _, outs = await task
    assert outs[-1].finish_reason is FinishReason.ABORT
    core.cache.check_integrity()
    assert core.cache.usage().referenced == 0
