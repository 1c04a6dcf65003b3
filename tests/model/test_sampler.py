"""The sampler against transformers' logits processors (the oracle), plus reproducibility,
statistics, logprobs, broken rows and the greedy fast path."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import hermes_async.model.sampler as sampler_mod
from hermes_async.model.logits_processors import draw_from_cdf
from hermes_async.model.sampler import (
    Sampler,
    SampleResult,
    SamplingRequest,
    min_tokens_ban,
)
from hermes_async.types import SamplingParams

INF = float("inf")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
MARGIN = 1e-5  # top-p / min-p cut-offs closer than this to a token are float-ambiguous


def oracle(logits: torch.Tensor, req: SamplingRequest) -> tuple[torch.Tensor, bool]:
    """transformers' processors in generate()'s order (plus the OpenAI penalty formula and the
    bans). Returns (probabilities, ambiguous): ambiguous when a top-p cut-off lies within MARGIN
    of a token's cumulative probability, or a min-p one within MARGIN (relative) of a token's
    probability, where float rounding may legitimately decide either way."""
    p = req.params
    scores = logits[None].clone()
    history = [*req.prompt_token_ids, *req.output_token_ids]
    ids = torch.tensor([history], dtype=torch.long)
    if p.repetition_penalty != 1.0 and history:
        scores = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, scores)
    for tok, count in Counter(req.output_token_ids).items():
        if tok < scores.shape[-1]:
            scores[0, tok] -= p.frequency_penalty * count + p.presence_penalty
    for tok in req.banned_token_ids:
        scores[0, tok] = -INF
    if p.greedy:
        return torch.nn.functional.one_hot(scores[0].argmax(), scores.shape[-1]).float(), False
    ambiguous = False
    scores = TemperatureLogitsWarper(p.temperature)(ids, scores)
    if p.top_k is not None:
        scores = TopKLogitsWarper(p.top_k)(ids, scores)
    if p.top_p < 1.0:
        probs = scores.sort().values.softmax(-1)
        near = (probs.cumsum(-1) - (1 - p.top_p)).abs() < MARGIN
        ambiguous |= bool((near & (probs > 0)).any())
        scores = TopPLogitsWarper(p.top_p)(ids, scores)
    if p.min_p > 0.0:
        probs = scores.softmax(-1)
        threshold = p.min_p * probs.max()
        ambiguous |= bool(((probs - threshold).abs() <= MARGIN * threshold).any())
        scores = MinPLogitsWarper(p.min_p)(ids, scores)
    return scores.softmax(-1)[0], ambiguous


@st.composite
def rows(draw, vocab: int) -> tuple[torch.Tensor, SamplingRequest]:
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32)))
    logits = torch.randn(vocab, generator=gen) * draw(st.sampled_from([0.3, 1.0, 3.0]))
    ids = st.lists(st.integers(0, vocab + 2), max_size=12)  # ids >= vocab must be ignored
    params = SamplingParams(
        temperature=draw(st.sampled_from([0.0, 0.1, 0.7, 1.0, 1.5, 3.0])),
        top_k=draw(st.none() | st.integers(1, vocab + 3)),
        top_p=draw(st.sampled_from([1.0]) | st.floats(0.05, 1.0)),
        min_p=draw(st.sampled_from([0.0]) | st.floats(0.0, 1.0)),
        repetition_penalty=draw(st.sampled_from([1.0]) | st.floats(0.3, 3.0)),
        frequency_penalty=draw(st.sampled_from([0.0]) | st.floats(-2.0, 2.0)),
        presence_penalty=draw(st.sampled_from([0.0]) | st.floats(-2.0, 2.0)),
    )
    banned = draw(st.frozensets(st.integers(0, vocab - 1), max_size=vocab - 1))
    return logits, SamplingRequest(params, draw(ids), draw(ids), None, banned)


@st.composite
def batches(draw) -> tuple[torch.Tensor, list[SamplingRequest]]:
    vocab = draw(st.sampled_from([2, 5, 64, 300]))
    pairs = draw(st.lists(rows(vocab), min_size=1, max_size=6))
    return torch.stack([lg for lg, _ in pairs]), [r for _, r in pairs]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches(), candidates=st.sampled_from([1, 3, 1024]))
def test_distribution_matches_transformers_processors(batch, candidates) -> None:
    logits, reqs = batch
    before = logits.clone()
    got = Sampler(top_p_candidates=candidates).distribution(logits, reqs)
    assert torch.equal(logits, before)  # input untouched
    for i, req in enumerate(reqs):
        want, ambiguous = oracle(logits[i], req)
        if ambiguous:
            event("row skipped: cut-off within float rounding of a token")
            continue
        # the support must agree (probabilities below 1e-30 are float32 underflow noise)
        tiny = (got[i] < 1e-30) & (want < 1e-30)
        assert torch.equal((got[i] > 0) | tiny, (want > 0) | tiny), (req.params, i)
        torch.testing.assert_close(got[i], want, atol=1e-5, rtol=0)


@settings(max_examples=60, deadline=None)
@given(batch=batches(), seed=st.integers(0, 2**16))
def test_sampled_tokens_lie_in_the_support(batch, seed) -> None:
    logits, reqs = batch
    sampler = Sampler(seed=seed)
    support = sampler.distribution(logits, reqs) > 0
    tokens = sampler.sample(logits, reqs).token_ids
    assert all(bool(support[i, t]) for i, t in enumerate(tokens))


def test_penalties_follow_the_reference_formulas() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 0.0]])
    req = SamplingRequest(SamplingParams(temperature=0.0, repetition_penalty=2.0,
                                         frequency_penalty=0.5, presence_penalty=0.25),
                          prompt_token_ids=[0], output_token_ids=[1, 1, 4])
    # repetition: 0 (prompt) 2.0 -> 1.0; 1 -1.0 -> -2.0; 4 0.0 -> 0.0. Then output counts:
    # 1 -> -2.0 - 2*0.5 - 0.25 = -3.25; 4 -> 0.0 - 0.5 - 0.25 = -0.75; 3 untouched -> argmax.
    assert Sampler().sample(logits, [req]).token_ids == [3]
    for ban, want in (({3}, 0), ({0, 3}, 2)):  # 0: 1.0 after the penalty; then 2: 0.5
        banned = dataclasses.replace(req, banned_token_ids=frozenset(ban))
        assert Sampler().sample(logits, [banned]).token_ids == [want]


def run_steps(sampler: Sampler, target: SamplingParams, steps: int, vocab: int, companions: int,
              rng: random.Random) -> list[int]:
    """Sample ``steps`` tokens for a seeded target request whose logits depend only on the step,
    batched with ``companions`` random other requests at a random position each step."""
    generator = sampler.new_generator(target.seed)
    others = [sampler.new_generator(rng.randrange(100)) if rng.random() < 0.5 else None
              for _ in range(companions)]
    out: list[int] = []
    for step in range(steps):
        step_logits = torch.randn(vocab, generator=torch.Generator().manual_seed(step)) * 2
        mine = SamplingRequest(target, [1, 2, 3], tuple(out), generator)
        batch = [SamplingRequest(SamplingParams(temperature=rng.choice([0.0, 0.5, 1.0, 2.0]),
                                                top_p=rng.choice([1.0, 0.8]),
                                                top_k=rng.choice([None, 5, 500]),
                                                frequency_penalty=rng.choice([0.0, 1.0])),
                                 [], [rng.randrange(vocab)], g) for g in others]
        pos = rng.randrange(len(batch) + 1)
        batch.insert(pos, mine)
        logits = torch.randn(len(batch), vocab) * 3
        logits[pos] = step_logits
        out.append(sampler.sample(logits.to(sampler.device), batch).token_ids[pos])
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("target", [
    SamplingParams(temperature=1.0, seed=7),
    SamplingParams(temperature=0.8, top_k=200, top_p=0.9, min_p=0.02, repetition_penalty=1.3,
                   frequency_penalty=0.4, presence_penalty=0.2, seed=12345),
    SamplingParams(temperature=1.2, top_p=0.95, seed=-3),
])
def test_seeded_request_is_reproducible_whatever_the_batch(device, target) -> None:
    alone = run_steps(Sampler(device, seed=1), target, 30, 2048, 0,
                      random.Random(0))
    batched = run_steps(Sampler(device, seed=2), target, 30, 2048, 8, random.Random(1))
    assert alone == batched
    assert len(set(alone)) > 5  # really sampled, not stuck on one token
    other_seed = dataclasses.replace(target, seed=target.seed + 1)
    assert run_steps(Sampler(device), other_seed, 30, 2048, 0, random.Random(0)) != alone


def test_new_generator_streams() -> None:
    sampler = Sampler()
    draws = [torch.rand(4, generator=g).tolist() for g in (
        sampler.new_generator(5), sampler.new_generator(5), sampler.new_generator(5, stream=1),
        sampler.new_generator(None), sampler.new_generator(None))]
    assert draws[0] == draws[1]
    assert len({tuple(d) for d in draws}) == 4


def chi_square(tokens: list[int], expected: list[float]) -> float:
    counts = Counter(tokens)
    n = len(tokens)
    assert set(counts) <= {i for i, p in enumerate(expected) if p > 0}
    return sum((counts[i] - n * p) ** 2 / (n * p) for i, p in enumerate(expected) if p > 0)


# chi-square critical values at p = 0.001 by degrees of freedom
CRITICAL = {5: 20.515, 4: 18.467, 2: 13.816, 1: 10.828}


@pytest.mark.parametrize(("params", "expected"), [
    (SamplingParams(temperature=1.0), [0.4, 0.25, 0.15, 0.1, 0.07, 0.03]),
    # temperature 0.5 squares the probabilities; top_k=3 keeps 0.4, 0.25, 0.15
    (SamplingParams(temperature=0.5, top_k=3), [0.16 / 0.245, 0.0625 / 0.245, 0.0225 / 0.245,
                                                0, 0, 0]),
    # top_p=0.6: 0.4 has nothing above it, 0.25 has 0.4 < 0.6 above, 0.15 has 0.65 -> cut
    (SamplingParams(top_p=0.6), [0.4 / 0.65, 0.25 / 0.65, 0, 0, 0, 0]),
])
def test_sampling_frequencies_match_the_distribution(params, expected) -> None:
    logits = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.07, 0.03]).log()
    n = 20_000
    shared = Sampler(seed=1234).sample(logits.expand(n, -1), [SamplingRequest(params)] * n)
    dof = sum(p > 0 for p in expected) - 1
    assert chi_square(shared.token_ids, expected) < CRITICAL[dof]
    # one seeded generator drawn 4000 times, one row per call
    sampler = Sampler(seed=99)
    req = SamplingRequest(params, generator=sampler.new_generator(2024))
    tokens = [sampler.sample(logits[None], [req]).token_ids[0] for _ in range(4000)]
    assert chi_square(tokens, expected) < CRITICAL[dof]


def test_wide_rows_two_level_draw_matches_the_distribution() -> None:
    # 3000 ids (not a multiple of the 256-id blocks): four heavy tokens in different blocks,
    # a band of impossible ids, the rest of the mass spread thin over everything else
    vocab = 3000
    probs = torch.full((vocab,), 0.25 / (vocab - 4 - 50))
    probs[2940:2990] = 0.0
    heavy = {5: 0.3, 700: 0.2, 2999: 0.15, 1500: 0.1}
    for tok, p in heavy.items():
        probs[tok] = p
    n = 20_000
    tokens = Sampler(seed=5).sample(probs.log().expand(n, -1),
                                    [SamplingRequest(SamplingParams())] * n).token_ids
    assert not any(2940 <= t < 2990 for t in tokens)
    binned = [list(heavy).index(t) if t in heavy else len(heavy) for t in tokens]
    assert chi_square(binned, [*heavy.values(), 0.25]) < CRITICAL[4]


def test_two_level_draw_is_the_same_inverse_cdf() -> None:
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(64, 5000, generator=gen) * 3, dim=-1)
    probs[:, 4000:4100] = 0.0
    uniforms = torch.rand(64, dtype=torch.float64, generator=gen)
    direct, alive_direct = draw_from_cdf(probs, uniforms, block=5000)
    blocked, alive_blocked = draw_from_cdf(probs, uniforms, block=16)
    assert alive_direct.all() and alive_blocked.all()
    assert torch.equal(direct, blocked)
    edge = torch.zeros(2, 5000)
    edge[0, 4999] = 1.0  # all mass on the last id (inside the padded last block)
    edge[1] = float("nan")
    columns, alive = draw_from_cdf(edge, torch.tensor([0.999, 0.5], dtype=torch.float64),
                                   block=256)
    assert columns[0] == 4999 and alive.tolist() == [True, False]
    assert 0 <= columns[1] < 5000


def test_greedy_is_argmax_with_lowest_id_on_ties_and_ignores_filters() -> None:
    logits = torch.tensor([[0.0, 5.0, 5.0, 1.0], [3.0, 3.0, 3.0, 3.0], [-1.0, -2.0, 7.0, 7.0]])
    reqs = [SamplingRequest(SamplingParams(temperature=0.0, top_k=1, top_p=0.1, min_p=0.9))] * 3
    assert Sampler().sample(logits, reqs).token_ids == [1, 0, 2]


def test_all_greedy_batch_is_one_argmax_with_no_filtering(monkeypatch) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("greedy fast path must not reach the filters")

    def no_copy(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
        assert len(rows) == t.shape[0], "greedy fast path must not gather rows"
        return t

    for name in ("apply_penalties", "ban_tokens", "filtered_probs", "draw_from_cdf"):
        monkeypatch.setattr(sampler_mod, name, forbidden)
    monkeypatch.setattr(sampler_mod, "select_rows", no_copy)
    logits = torch.randn(32, 49152)
    reqs = [SamplingRequest(SamplingParams(temperature=0.0, logprobs=False))] * 32
    assert Sampler().sample(logits, reqs).token_ids == logits.argmax(-1).tolist()


def test_banned_ids_are_never_chosen() -> None:
    logits = torch.tensor([[9.0, 8.0, 0.0, -3.0]] * 400)
    ban = frozenset({0, 1})
    reqs = [SamplingRequest(SamplingParams(temperature=t), banned_token_ids=ban)
            for t in (0.0, 1.0, 5.0, 100.0)] * 100
    assert not set(Sampler(seed=0).sample(logits, reqs).token_ids) & ban


def test_min_tokens_ban() -> None:
    params = SamplingParams(min_tokens=2, stop_token_ids=(7,))
    assert min_tokens_ban(params, 1, [2]) == {2, 7}
    assert min_tokens_ban(params, 2, [2]) == frozenset()
    ignoring = SamplingParams(min_tokens=2, stop_token_ids=(7,), ignore_eos=True)
    assert min_tokens_ban(ignoring, 0, [2]) == {7}


def test_broken_rows_fall_back_without_disturbing_the_others() -> None:
    vocab = 50
    good = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))
    sampler = Sampler(seed=0)
    good_reqs = [SamplingRequest(SamplingParams(temperature=0.9, top_p=0.9, seed=s),
                                 generator=sampler.new_generator(s)) for s in range(3)]
    alone = sampler.sample(good, good_reqs).token_ids
    nan_row = torch.full((vocab,), float("nan"))
    some_nan = good[0].clone()
    some_nan[[3, 4]] = float("nan")
    inf_row = torch.zeros(vocab)
    inf_row[17] = INF
    broken = [nan_row, torch.full((vocab,), -INF), inf_row, some_nan, torch.zeros(vocab)]
    broken_reqs = [
        SamplingRequest(SamplingParams(temperature=1.0)),                      # all NaN -> 0
        SamplingRequest(SamplingParams(temperature=0.5, logprobs=True)),       # all -inf -> 0
        SamplingRequest(SamplingParams(temperature=1.0, top_k=3)),             # +inf -> 17
        SamplingRequest(SamplingParams(temperature=0.0)),  # NaN ignored -> argmax of the rest
        SamplingRequest(SamplingParams(temperature=1.0),                       # all banned:
                        banned_token_ids=frozenset(range(vocab))),             # raw argmax 0
    ]
    for g in (r.generator for r in good_reqs):
        g.manual_seed(g.initial_seed())
    logits = torch.cat([good[:1], torch.stack(broken), good[1:]])
    reqs = [good_reqs[0], *broken_reqs, *good_reqs[1:]]
    result = sampler.sample(logits, reqs)
    ids = result.token_ids
    assert [ids[0], ids[6], ids[7]] == alone
    assert ids[1:6] == [0, 0, 17, int(some_nan.nan_to_num(nan=-INF).argmax()), 0]
    assert isinstance(result.logprobs[2], float)  # no finite logit: value undefined
    for greedy in (True, False):  # the greedy paths agree on the all-NaN row
        req = SamplingRequest(SamplingParams(temperature=0.0 if greedy else 1.0))
        assert sampler.sample(nan_row[None], [req]).token_ids == [0]


def test_logprobs_are_raw_log_softmax() -> None:
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(3))
    reqs = [SamplingRequest(SamplingParams(temperature=0.7, top_k=2, top_logprobs=5),
                            output_token_ids=[1, 2], generator=None),
            SamplingRequest(SamplingParams(temperature=0.0)),
            SamplingRequest(SamplingParams(temperature=0.0, logprobs=True, frequency_penalty=2.0),
                            output_token_ids=[int(logits[2].argmax())])]
    result = Sampler(seed=0).sample(logits, reqs)
    assert isinstance(result, SampleResult)
    raw = torch.log_softmax(logits, -1)
    assert result.logprobs[1] is None and result.top_logprobs[1] is None
    assert result.top_logprobs[2] == []
    for i in (0, 2):
        assert result.logprobs[i] == pytest.approx(float(raw[i, result.token_ids[i]]), abs=1e-6)
    top = result.top_logprobs[0]
    want = raw[0].topk(5)
    assert [t for t, _ in top] == want.indices.tolist()
    assert [v for _, v in top] == pytest.approx(want.values.tolist(), abs=1e-6)


def test_low_precision_logits_and_argument_checks() -> None:
    sampler = Sampler()
    logits = torch.randn(2, 30).to(torch.bfloat16)
    reqs = [SamplingRequest(SamplingParams(temperature=0.0))] * 2
    assert sampler.sample(logits, reqs).token_ids == logits.float().argmax(-1).tolist()
    assert sampler.sample(torch.empty(0, 30), []) == SampleResult([], None, None)
    with pytest.raises(ValueError, match="do not match"):
        sampler.sample(torch.randn(3, 30), reqs)
    with pytest.raises(ValueError, match="sampler on"):
        sampler.sample(torch.randn(2, 30, device="meta"), reqs)
    with pytest.raises(ValueError):
        Sampler(top_p_candidates=0)
