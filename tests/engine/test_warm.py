"""``AsyncEngine.warm``: prefill without answering, pins that outlive an eviction storm until
their TTL, the pin cap, and warm-up prompts from the config at start-up (fake runner)."""

from __future__ import annotations

import asyncio

from hermes_async.config import CacheConfig, EngineConfig, SchedulerConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.types import SamplingParams
from tests.engine.fake_runner import FakeRunner, fake_output_text, reference_tokens

BS = 4
SYSTEM = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]  # 3 full blocks + 1 token


class WordTokenizer:
    """Encodes the prompt "ignored" as SYSTEM (what the config's warm prompt needs)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(SYSTEM) if text == "ignored" else []


def make_engine(num_blocks: int = 24, **cache: object) -> AsyncEngine:
    cfg = EngineConfig(
        cache=CacheConfig(block_size=BS, high_watermark=0.5, low_watermark=0.25, **cache),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64))
    return AsyncEngine(cfg, runner=FakeRunner(num_blocks=num_blocks), tokenizer=object(),
                       eos_token_ids=[2], output_text=fake_output_text,
                       background_interval_s=0.001)


async def storm(engine: AsyncEngine, first: int, n: int) -> None:
    """``n`` disjoint 3-block prompts, four at a time, answered in full."""
    async def one(i: int) -> None:
        prompt = [1000 + 20 * i + k for k in range(3 * BS + 1)]
        ids = [t for out in [o async for o in engine.generate(
            token_ids=prompt, params=SamplingParams(max_tokens=3, ignore_eos=True))]
            for t in out.token_ids]
        assert ids == reference_tokens(prompt, 3)

    for start in range(first, first + n, 4):
        await asyncio.gather(*(one(i) for i in range(start, start + 4)))
    await asyncio.sleep(0.05)  # background eviction


async def test_warm_prefills_without_answering_and_later_requests_hit() -> None:
    async with make_engine() as engine:
        res = await engine.warm(token_ids=SYSTEM, namespace="t")
        assert (res.prompt_tokens, res.cached_tokens, res.already_cached_tokens) == (13, 12, 0)
        assert res.pin is None and engine.core.cache.pins_of() == []
        outs = [o async for o in engine.generate(token_ids=[*SYSTEM, 30, 31], namespace="t",
                                                 params=SamplingParams(max_tokens=2))]
        assert outs[-1].usage.cached_tokens == 12
        again = await engine.warm(token_ids=SYSTEM, namespace="t")
        assert again.already_cached_tokens == 12
        assert not engine.core.requests and engine.core.cache.usage().referenced == 0


async def test_pinned_warm_survives_an_eviction_storm_until_its_ttl() -> None:
    async with make_engine() as engine:
        cache = engine.core.cache
        res = await engine.warm(token_ids=SYSTEM, pin_ttl_s=0.6)
        assert res.pin is not None and res.pin["blocks"] == 3 and res.pin["tokens"] == 12
        await storm(engine, 0, 12)  # 36+ blocks of traffic through a 24-block pool
        assert cache.stats().namespaces["default"].evicted_blocks > 0
        assert cache.probe("default", SYSTEM) == 12
        await asyncio.sleep(0.7)  # the TTL lapses; the background task drops the pin
        assert cache.pins_of() == []
        await storm(engine, 100, 12)
        assert cache.probe("default", SYSTEM) == 0
        cache.check_integrity()


async def test_pin_over_the_cap_is_refused_but_the_prompt_is_cached() -> None:
    async with make_engine(max_pinned_fraction=0.1) as engine:  # 2 of 24 blocks
        res = await engine.warm(token_ids=SYSTEM, pin_ttl_s=60)
        assert res.pin is None and "max_pinned_blocks" in (res.pin_error or "")
        assert res.cached_tokens == 12 and engine.core.cache.usage().referenced == 0


async def test_config_warm_prompts_run_at_start() -> None:
    engine = make_engine()
    cfg = engine.config.replace(cache={"warm": [{"prompt": "ignored", "pin_ttl_s": 30}]})
    engine.config = cfg
    engine._injected = (engine._injected[0], WordTokenizer(), *engine._injected[2:])
    async with engine:
        assert engine.core.cache.probe("default", SYSTEM) == 12
        (pin,) = engine.core.cache.pins_of("default")
        assert pin.ttl_s == 30
