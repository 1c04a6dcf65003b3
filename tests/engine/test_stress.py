"""300 requests with shared prefixes, random parameters, random aborts and a runner that fails
2% of its steps: at the end nothing runs, waits or is pinned, the cache is intact, and every
request that was not aborted got either its complete, correct output or an error."""

from __future__ import annotations

import asyncio
import random

from hermes_async.types import FinishReason, SamplingParams
from tests.engine.fake_runner import reference_tokens
from tests.engine.test_engine_fake import assert_idle, make_engine


async def test_stress_random_traffic_aborts_and_failures():
    rng = random.Random(7)
    prefixes = [[rng.randrange(3, 900) for _ in range(rng.randrange(4, 40))] for _ in range(6)]
    engine = make_engine(num_blocks=64, budget=48, max_seqs=12, fail_every=50,
                         policy="cache_aware")  # 2% of steps fail, on a fixed schedule
    outcomes = {"complete": 0, "error": 0, "aborted": 0}

    async def one(i: int) -> None:
        if i % 2:  # half arrive in one burst (the pool must preempt), half spread out
            await asyncio.sleep(rng.random() * 0.3)
        prompt = rng.choice(prefixes)[: rng.randrange(1, 40)] + [
            rng.randrange(3, 900) for _ in range(rng.randrange(1, 20))]
        n = rng.choice([1, 1, 1, 2, 3])
        max_tokens = rng.randrange(1, 24)
        params = SamplingParams(n=n, max_tokens=max_tokens, temperature=rng.random(),
                                top_p=rng.uniform(0.5, 1.0), seed=rng.randrange(1000))
        # 20% are aborted: half while queued (at once), half after a random number of outputs
        abort_at = rng.choice([0, rng.randrange(1, 6)]) if rng.random() < 0.2 else None
        rid = f"stress-{i}"
        texts: dict[int, list[int]] = {k: [] for k in range(n)}
        finals = {}

        async def consume():
            seen = 0
            async for out in engine.generate(token_ids=prompt, params=params, request_id=rid):
                texts[out.index].extend(out.token_ids)
                if out.finish_reason is not None:
                    finals[out.index] = out
                seen += 1
                if abort_at is not None and seen == abort_at:
                    engine.abort(rid)

        task = asyncio.create_task(consume())
        if abort_at == 0:
            await asyncio.sleep(0)
            engine.abort(rid)
        await task
        reasons = {o.finish_reason for o in finals.values()}
        assert len(finals) == n, "every sequence must end"
        if FinishReason.ABORT in reasons:
            outcomes["aborted"] += 1
        elif FinishReason.ERROR in reasons:
            assert all(o.error for o in finals.values()
                       if o.finish_reason is FinishReason.ERROR)
            outcomes["error"] += 1
        else:
            ref = reference_tokens(prompt, max_tokens)
            for k in range(n):
                assert texts[k] == ref, (i, k)
            outcomes["complete"] += 1

    async with engine:
        await asyncio.gather(*(one(i) for i in range(300)))
        await asyncio.sleep(0.01)
        assert_idle(engine)
        assert engine.runner.failures > 0
        assert engine.core.scheduler.num_preemptions > 0
    assert sum(outcomes.values()) == 300
    assert outcomes["complete"] > 150 and outcomes["error"] > 0 and outcomes["aborted"] > 0
