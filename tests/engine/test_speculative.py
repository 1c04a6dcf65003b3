"""Speculative decoding (``speculative.method = "ngram"``): drafts verified in the batch.

Oracles: a brute-force search for the n-gram proposer; for the engine, the same engine without
speculation over the real runner (tiny random Llama, float32): greedy answers must agree token
for token (a divergence only where the top two logits tie within ``TIE``, checked on
transformers' model), and so must seeded sampled answers (each drafted position draws from
the sequence's stream, rewound to the draws of the tokens kept); and, for unseeded sampling,
the exact probabilities of a fixed Markov chain served through the real executor and sampler
(a chi-square test).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random

import pytest
import torch

from hermes_async import AsyncEngine as DefaultEngine
from hermes_async.config import (
    CacheConfig,
    ConfigError,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.engine.ngram import CANDIDATES, INDEXED_N, NgramIndex
from hermes_async.model.executor import StepExecutor
from hermes_async.model.runner import ModelRunner
from hermes_async.step import SampledToken, accepted_samples
from hermes_async.types import FinishReason, GuideKind, SamplingParams, StructuredOutput
from tests.engine.fake_runner import fake_output_text
from tests.engine.test_engine_model import assert_same_greedy
from tests.tiny_models import load_oracle, make_tiny_model

NGRAM = SpeculativeConfig(method="ngram", num_tokens=4, min_n=1, max_n=3, max_batch_seqs=64,
                          adaptive=False)


# ----- the proposer -----------------------------------------------------------------------------
def brute_force(tokens: list[int], k: int, min_n: int, max_n: int) -> tuple[int, ...]:
    """The proposal as NgramIndex's contract states it, searched by brute force."""
    length, top = len(tokens), min(max_n, INDEXED_N)
    for n in range(min(top, length - 1), min_n - 1, -1):
        ends = [end for end in range(n, length) if tokens[end - n:end] == tokens[length - n:]]
        if ends:
            break
    else:
        return ()

    def reach(end: int) -> int:  # how many tokens before `end` equal the tail's last ones
        m = 0
        while m < max_n and m < end and tokens[end - m - 1] == tokens[length - m - 1]:
            m += 1
        return m

    ends = ends[-CANDIDATES:]
    furthest = max(reach(end) for end in ends)
    follows = [tuple(tokens[end:end + k]) for end in ends if reach(end) == furthest]
    return max(follows, key=lambda f: (follows.count(f), -follows.index(f)))


@pytest.mark.parametrize("seed", range(10))
def test_ngram_index_proposes_what_a_brute_force_search_finds(seed):
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 5, 20])
    min_n = rng.randint(1, 3)
    max_n = rng.choice([min_n, 4, 7, 32])
    index = NgramIndex(min_n, max_n)
    tokens = [rng.randrange(vocab) for _ in range(rng.randint(0, 8))]
    for _ in range(200):
        tokens.extend(rng.randrange(vocab) for _ in range(rng.choice([1, 1, 1, 3])))
        k = rng.randint(1, 5)
        assert index.propose(tokens, k) == brute_force(tokens, k, min_n, max_n), tokens


def test_ngram_index_edges():
    assert NgramIndex(1, 2).propose([], 3) == ()
    assert NgramIndex(1, 2).propose([7], 3) == ()
    assert NgramIndex(2, 2).propose([1, 2, 3, 1, 2], 4) == (3, 1, 2)
    assert NgramIndex(1, 1).propose([5, 5, 5], 4) == (5, 5)  # ties: the earliest
    assert NgramIndex(1, 1).propose([4, 5, 5], 4) == (5,)  # runs into the end
    # the occurrence whose match reaches furthest back wins over a later one
    source, echo = [5, 1, 2, 3, 4, 10], [6, 1, 2, 3, 4, 11]
    assert NgramIndex(1, 8).match(source + echo + [5, 1, 2, 3, 4], 1) == ((10,), 5)
    # among equally long matches the most common continuation, the earliest on ties
    body = [1, 2, 3, 4]
    votes = body + [10, 0] + body + [11, 0] + body + [11, 0, 9] + body
    assert NgramIndex(1, 4).match(votes, 2) == ((11, 0), 4)
    assert NgramIndex(1, 4).propose(body + [10, 0] + body + [11, 0] + body, 1) == (10,)
    with pytest.raises(ValueError):
        NgramIndex(3, 2)


def test_acceptance_keeps_samples_while_each_equals_its_draft():
    s = [SampledToken(t) for t in (4, 5, 9, 7)]
    assert [t.token_id for t in accepted_samples((4, 5, 6), s).tokens] == [4, 5, 9]
    assert [t.token_id for t in accepted_samples((1, 5, 9), s).tokens] == [4]
    assert [t.token_id for t in accepted_samples((4, 5, 9), s).tokens] == [4, 5, 9, 7]
    with pytest.raises(ValueError):
        accepted_samples((1,), s)


def test_speculative_config_rules():
    assert not SpeculativeConfig().enabled and NGRAM.enabled
    for bad in ({"method": "eagle"}, {"num_tokens": 0}, {"min_n": 3, "max_n": 2},
                {"max_batch_seqs": 0}):
        with pytest.raises(ConfigError):
            SpeculativeConfig(**bad)


# ----- the engine over a tiny model -------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("spec-llama"), "llama", seed=3)
    return path, load_oracle(path)


def engine_for(path, spec: SpeculativeConfig | None = None, *, kv_bytes=4 << 20, budget=256):
    cfg = EngineConfig(
        model=ModelConfig(dtype="float32", device="cpu"),
        cache=CacheConfig(block_size=8, kv_cache_bytes=kv_bytes),
        scheduler=SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=budget),
        speculative=spec or SpeculativeConfig(),
    )
    runner = StepExecutor(ModelRunner(path, cfg.model, cfg.cache))
    return AsyncEngine(cfg, runner=runner, tokenizer=object(), eos_token_ids=[],
                       output_text=fake_output_text)


def copying_prompts(count=12, seed=0):
    """Prompts that repeat a span of themselves (what the answer may copy), some long enough
    to be chunked beside the others' decodes."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        span = [rng.randrange(3, 320) for _ in range(rng.randrange(4, 40))]
        out.append([rng.randrange(3, 320) for _ in range(rng.randrange(0, 8))] + span * 3)
    return out


async def run_all(engine, ps, params, concurrent=True):
    async def one(p):
        per_index: dict[int, list[int]] = {}  # n > 1: each sequence's own tokens, in order
        last = None
        async for out in engine.generate(token_ids=p, params=params):
            per_index.setdefault(out.index, []).extend(out.token_ids)
            last = out
        return [t for i in sorted(per_index) for t in per_index[i]], last

    async with engine:
        if concurrent:
            results = await asyncio.gather(*(one(p) for p in ps))
        else:
            results = [await one(p) for p in ps]
        engine.check_integrity()
        load = engine.load()
    assert load.blocks.referenced == load.blocks.private == 0, load  # nothing held at the end
    return results


def accepted(engine) -> tuple[float, float]:
    m = engine.metrics
    return m.spec_draft_tokens._value.get(), m.spec_accepted_tokens._value.get()


GREEDY = SamplingParams(max_tokens=32, temperature=0.0)


@pytest.mark.parametrize("variant", ["alone", "batched", "chunked", "preempting"])
async def test_greedy_with_drafts_equals_without(tiny, variant):
    path, oracle = tiny
    ps = copying_prompts()
    kw = {"alone": {}, "batched": {}, "chunked": {"budget": 40},
          "preempting": {"kv_bytes": 6144 * 48}}[variant]
    concurrent = variant != "alone"
    ref = await run_all(engine_for(path, **kw), ps, GREEDY, concurrent)
    engine = engine_for(path, NGRAM, **kw)
    got = await run_all(engine, ps, GREEDY, concurrent)
    for p, (a, _), (b, last) in zip(ps, ref, got, strict=True):
        assert_same_greedy(oracle, p, a, b)
        assert len(b) == 32 and last.usage.completion_tokens == 32
    drafted, kept = accepted(engine)
    assert drafted > 0 and 0 < kept <= drafted
    if variant == "preempting":
        assert engine.metrics.preemptions._value.get() > 0


async def test_suffix_tree_drafts_from_earlier_answers_and_changes_nothing(tiny):
    """``suffix``: the second pass over the same prompts drafts from the first pass's answers
    (the shared tree), adaptively; answers as without, per-request usage figures add up."""
    path, oracle = tiny
    ps = copying_prompts(6, seed=5)
    ref = await run_all(engine_for(path), ps, GREEDY)
    engine = engine_for(path, SpeculativeConfig(method="suffix", min_n=1, max_batch_seqs=64))
    async with engine:
        for _ in range(2):
            got = []
            for p in ps:
                ids, last = [], None
                async for out in engine.generate(token_ids=p, params=GREEDY):
                    ids.extend(out.token_ids)
                    last = out
                got.append((ids, last))
            for p, (a, _), (b, _) in zip(ps, ref, got, strict=True):
                assert_same_greedy(oracle, p, a, b)
        stats = engine.core.drafter.stats()
        engine.check_integrity()
    assert stats["answer_trees"]["answers"] == 12
    usage = [last.usage for _, last in got]
    assert sum(u.draft_tokens for u in usage) > 0
    assert all(0 <= u.accepted_draft_tokens <= u.draft_tokens for u in usage)
    assert sum(u.accepted_draft_tokens for u in usage) <= stats["accepted_tokens"]


async def test_aborts_mid_draft_leave_nothing_held(tiny):
    path, _ = tiny
    engine = engine_for(path, NGRAM)
    ps = copying_prompts(8, seed=9)

    async def leave_after(p, outputs):
        seen = 0
        async for _ in engine.generate(token_ids=p, params=GREEDY):
            seen += 1
            if seen >= outputs:
                break  # leaving the loop aborts the request

    async with engine:
        await asyncio.gather(*(leave_after(p, 1 + i % 3) for i, p in enumerate(ps)))
        for _ in range(3):
            await asyncio.sleep(0.05)
        engine.check_integrity()
        load = engine.load()
    assert load.requests == load.running == load.waiting == 0
    assert load.blocks.referenced == load.blocks.private == 0
    assert accepted(engine)[0] > 0


async def test_seeded_sampling_with_drafts_is_the_same_as_without(tiny):
    path, _ = tiny
    ps = copying_prompts(6, seed=4)
    params = SamplingParams(max_tokens=24, temperature=0.3, seed=99, n=2)
    ref = await run_all(engine_for(path), ps, params)
    engine = engine_for(path, NGRAM)
    got = await run_all(engine, ps, params)
    assert [ids for ids, _ in got] == [ids for ids, _ in ref]
    assert accepted(engine)[1] > 0


async def test_no_overshoot_and_the_rules_that_see_the_output(tiny):
    """max_tokens, a stop token id met inside a kept draft, min_tokens, penalties, logprobs:
    the same answers as without drafts (the penalties and bans of each drafted position see
    the drafts before it)."""
    path, oracle = tiny
    ps = copying_prompts(6, seed=7)
    plain = await run_all(engine_for(path), ps, GREEDY)
    stop = plain[0][0][10]  # a token the first answer writes
    cases = [SamplingParams(max_tokens=5, temperature=0.0),
             SamplingParams(max_tokens=32, temperature=0.0, stop_token_ids=(stop,)),
             SamplingParams(max_tokens=32, temperature=0.0, stop=(f"<{stop}>",)),
             SamplingParams(max_tokens=20, temperature=0.0, min_tokens=12,
                            stop_token_ids=(stop,)),
             SamplingParams(max_tokens=20, temperature=0.0, frequency_penalty=0.5,
                            repetition_penalty=1.1),
             SamplingParams(max_tokens=20, temperature=0.0, logprobs=True, top_logprobs=2)]
    for params in cases:
        ref = await run_all(engine_for(path), ps, params)
        got = await run_all(engine_for(path, NGRAM), ps, params)
        for p, (a, ra), (b, rb) in zip(ps, ref, got, strict=True):
            assert_same_greedy(oracle, p, a, b)
            if a == b:
                assert ra.finish_reason == rb.finish_reason
                assert ra.usage.completion_tokens == rb.usage.completion_tokens
            if params.max_tokens == 5:
                assert len(b) == 5 and rb.finish_reason is FinishReason.LENGTH
            if params.stop_token_ids and a == b:
                assert stop not in b


async def test_logprobs_of_kept_drafts_match_the_plain_decode(tiny):
    path, _ = tiny
    ps = copying_prompts(4, seed=2)
    params = SamplingParams(max_tokens=16, temperature=0.0, logprobs=True)

    async def logprobs(engine):
        out = []
        async with engine:
            for p in ps:
                row = []
                async for o in engine.generate(token_ids=p, params=params):
                    row.extend((lp.token_id, lp.logprob) for lp in o.logprobs)
                out.append(row)
        return out

    ref = await logprobs(engine_for(path))
    got = await logprobs(engine_for(path, NGRAM))
    for a, b in zip(ref, got, strict=True):
        if [t for t, _ in a] == [t for t, _ in b]:
            pairs = zip(a, b, strict=True)
            assert all(math.isclose(x, y, abs_tol=1e-4) for (_, x), (_, y) in pairs)


async def test_no_drafts_above_the_batch_load(tiny):
    path, _ = tiny
    ps = copying_prompts(6, seed=1)
    engine = engine_for(path, SpeculativeConfig(method="ngram", min_n=1, max_batch_seqs=2))
    await run_all(engine, ps, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    # six decode together at first: no drafts until at most two still decode (none here:
    # all finish together)
    assert accepted(engine) == (0.0, 0.0)


# ----- the default model: copying answers, structured outputs -----------------------------------
def default_engine(spec: SpeculativeConfig | None = None) -> DefaultEngine:
    return DefaultEngine(EngineConfig(model=ModelConfig(dtype="float32"),
                                    speculative=spec or SpeculativeConfig()))


COPY_MESSAGES = [
    [{"role": "user", "content": "Repeat this sentence exactly: The quick brown fox jumps over "
                                 "the lazy dog while the cat sleeps on the warm mat."}],
    [{"role": "user", "content": "Here is a JSON document: {\"name\": \"Ada\", \"age\": 36, "
                                 "\"city\": \"London\"}. Write it again with age 37."}],
]
PERSON = StructuredOutput(GuideKind.JSON, json.dumps({
    "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                     "city": {"type": "string"}},
    "required": ["name", "age", "city"], "additionalProperties": False}))


async def default_answers(engine, params):
    out = []
    async with engine:
        for messages in COPY_MESSAGES:
            ids = []
            async for o in engine.generate(messages=messages, params=params):
                ids.extend(o.token_ids)
            out.append(ids)
        engine.check_integrity()
    return out


@pytest.mark.parametrize("structured", [None, PERSON])
async def test_default_model_greedy_with_drafts_equals_without(structured):
    """The default model, float32: copying answers, free and under a JSON schema (drafts are
    the grammar's forced tokens or the n-gram's, cut where the grammar rejects them; each
    drafted position sampled under its own mask), token for token as without drafts."""
    params = SamplingParams(max_tokens=48, temperature=0.0, structured=structured)
    ref = await default_answers(default_engine(), params)
    engine = default_engine(NGRAM)
    got = await default_answers(engine, params)
    assert got == ref
    drafted, kept = accepted(engine)
    assert drafted > 0 and kept > 0
    if structured is not None:
        for ids in got:  # the answers are the schema's documents
            doc = json.loads(engine.tokenizer.decode(ids))
            assert set(doc) == {"name", "age", "city"}


# ----- sampled output keeps its distribution ----------------------------------------------------
class MarkovRunner:
    """A fixed distribution: the next token's logits depend on the last token only."""

    block_size, num_blocks, max_model_len = 8, 256, 2048
    device = torch.device("cpu")

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits

    def forward(self, steps):
        rows = []
        for s in steps:
            tail = s.token_ids[len(s.token_ids) - 1 - s.num_drafts:]
            rows.extend(self.logits[t] for t in tail)
        return torch.stack(rows)


def chain_probability(table: torch.Tensor, last: int, tokens: list[int]) -> float:
    p = 1.0
    for t in tokens:
        p *= float(table[last, t])
        last = t
    return p


async def test_unseeded_sampled_output_keeps_its_distribution():
    """Sequences of 4 tokens from a 3-token Markov chain: with drafts (the prompt cycles, so
    drafts are proposed and often accepted) the frequencies of the 81 sequences fit the
    chain's exact probabilities (chi-square, p > 0.001 at 2000 samples)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 3, generator=gen) * 1.5
    logits[0, 1] += 2.0
    logits[1, 2] += 2.0
    logits[2, 0] += 2.0  # the cycle 0 -> 1 -> 2 -> 0 is likely: drafts get kept
    table = torch.softmax(logits.double(), dim=-1)
    cfg = EngineConfig(model=ModelConfig(dtype="float32", device="cpu"),
                       cache=CacheConfig(block_size=8),
                       speculative=SpeculativeConfig(method="ngram", num_tokens=3, min_n=1,
                                                     max_n=2, max_batch_seqs=64))
    engine = AsyncEngine(cfg, runner=StepExecutor(MarkovRunner(logits)), tokenizer=object(),
                         eos_token_ids=[], output_text=fake_output_text)
    prompt = [0, 1, 2] * 4
    params = SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True)
    counts: dict[tuple[int, ...], int] = {}
    samples = 2000

    async def one():
        ids = []
        async for out in engine.generate(token_ids=prompt, params=params):
            ids.extend(out.token_ids)
        counts[tuple(ids)] = counts.get(tuple(ids), 0) + 1

    async with engine:
        for _ in range(samples // 50):
            await asyncio.gather(*(one() for _ in range(50)))
    drafted, kept = accepted(engine)
    assert drafted > 0 and kept > 0
    # chi-square over the sequences expected 5+ times, the rest pooled into one cell
    expected = {seq: samples * chain_probability(table, prompt[-1], list(seq))
                for seq in itertools.product(range(3), repeat=4)}
    big = [seq for seq, e in expected.items() if e >= 5]
    cells = [(counts.get(seq, 0), expected[seq]) for seq in big]
    cells.append((samples - sum(o for o, _ in cells), samples - sum(e for _, e in cells)))
    chi2 = sum((o - e) ** 2 / e for o, e in cells)
    p_value = float(torch.special.gammaincc(torch.tensor((len(cells) - 1) / 2.0,
                                                         dtype=torch.float64),
                                            torch.tensor(chi2 / 2.0, dtype=torch.float64)))
    assert p_value > 1e-3, (chi2, len(cells), counts)
