"""AsyncEngine over the real runner (tiny random Llama, float32): greedy outputs must not depend
on batching, prefix caching, chunking, preemption or ``n``.

Different batch shapes change float rounding. Where the top two logits of a step are closer
than ``TIE`` greedy is ambiguous, so a divergence is accepted only at such a step, checked on
transformers' own model (the oracle); anywhere else it fails.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from hermes_async.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.model.executor import StepExecutor
from hermes_async.model.runner import ModelRunner
from hermes_async.types import FinishReason, SamplingParams
from tests.engine.fake_runner import fake_output_text
from tests.tiny_models import load_oracle, make_tiny_model

TIE = 1e-4
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("engine-llama"), "llama", seed=3)
    return path, load_oracle(path)


def engine_for(path, *, kv_bytes=4 << 20, budget=256, max_seqs=32, prefix=True):
    cfg = EngineConfig(
        model=ModelConfig(dtype="float32", device="cpu"),
        cache=CacheConfig(block_size=8, kv_cache_bytes=kv_bytes, enable_prefix_caching=prefix),
        scheduler=SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget),
    )
    runner = StepExecutor(ModelRunner(path, cfg.model, cfg.cache))
    return AsyncEngine(cfg, runner=runner, tokenizer=object(), eos_token_ids=[],
                       output_text=fake_output_text)


def prompts(count=16, seed=0):
    rng = random.Random(seed)
    shared = [rng.randrange(3, 320) for _ in range(40)]
    return [shared[: rng.randrange(0, 40)] + [rng.randrange(3, 320) for _ in range(
        rng.randrange(1, 30))] for _ in range(count)]


async def run_all(engine, ps, params=None, concurrent=True):
    params = params or SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)

    async def one(p):
        ids = []
        async for out in engine.generate(token_ids=p, params=params):
            ids.extend(out.token_ids)
        return ids

    async with engine:
        if concurrent:
            return await asyncio.gather(*(one(p) for p in ps))
        return [await one(p) for p in ps]


def assert_same_greedy(oracle, prompt, a, b):
    if a == b:
        return
    k = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    with torch.no_grad():
        logits = oracle(torch.tensor([prompt + a[:k]])).logits[0, -1]
    gap = abs(float(logits[a[k]] - logits[b[k]]))
    assert gap < TIE, f"greedy diverged at step {k} with a logit gap of {gap}"


@pytest.fixture(scope="module")
def alone(tiny):
    path, _ = tiny
    ps = prompts()
    return ps, asyncio.run(run_all(engine_for(path), ps, concurrent=False))


def test_alone_matches_transformers_generate(tiny, alone):
    _, oracle = tiny
    ps, outs = alone
    for p, o in list(zip(ps, outs, strict=True))[:4]:
        with torch.no_grad():
            ref = oracle.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert_same_greedy(oracle, p, ref, o)


@pytest.mark.parametrize("variant", ["batch16", "no_prefix_cache", "chunked", "preempting"])
async def test_greedy_is_independent_of_scheduling(tiny, alone, variant):
    path, oracle = tiny
    ps, ref = alone
    kw = {"batch16": {}, "no_prefix_cache": {"prefix": False}, "chunked": {"budget": 32},
          "preempting": {"kv_bytes": 6144 * 40}}[variant]
    engine = engine_for(path, **kw)
    outs = await run_all(engine, ps)
    for p, a, b in zip(ps, ref, outs, strict=True):
        assert_same_greedy(oracle, p, a, b)
    if variant == "preempting":
        assert engine.metrics.preemptions._value.get() > 0


async def test_n3_greedy_equals_three_requests(tiny, alone):
    path, oracle = tiny
    ps, ref = alone
    engine = engine_for(path)
    got: dict[int, list[int]] = {0: [], 1: [], 2: []}
    async with engine:
        async for out in engine.generate(token_ids=ps[0], params=SamplingParams(
                n=3, max_tokens=MAX_TOKENS, temperature=0.0)):
            got[out.index].extend(out.token_ids)
    for seq in got.values():
        assert_same_greedy(oracle, ps[0], ref[0], seq)


async def test_seeded_sampling_is_reproducible_across_batches(tiny):
    path, _ = tiny
    ps = prompts(8, seed=5)
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=1234)
    alone = await run_all(engine_for(path), ps[:1], params)
    batched = await run_all(engine_for(path), ps, params)
    assert alone[0] == batched[0]


async def test_a_small_kv_pool_caps_max_model_len(tiny):
    """40 blocks of 8 tokens (6144 bytes each in float32) hold 320 of the model's 1024
    positions: the engine serves 320, and a request without ``max_tokens`` ends there."""
    path, _ = tiny
    engine = engine_for(path, kv_bytes=6144 * 40)
    async with engine:
        assert (engine.runner.num_blocks, engine.runner.block_size) == (40, 8)
        assert (engine.max_model_len, engine.runner.max_model_len) == (320, 1024)
        outs = [o async for o in engine.generate(token_ids=list(range(3, 303)),
                                                 params=SamplingParams(temperature=0.0,
                                                                       max_tokens=None))]
    assert outs[-1].finish_reason is FinishReason.LENGTH and outs[-1].error is None
    assert outs[-1].usage.completion_tokens == 20
