"""The drafting side of speculative decoding: the shared suffix tree of earlier answers
against a brute-force search over the stored answers, its bounds and namespaces, the step-cost
fit, and the adaptive draft length (:mod:`hermes_async.engine.drafts`)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from hermes_async.config import SpeculativeConfig
from hermes_async.engine.drafts import (
    MATCH_BUCKETS,
    PRIOR_KEPT,
    PRIOR_TESTED,
    Drafter,
    KeptChance,
    StepCost,
)
from hermes_async.engine.suffix import NODE_BYTES, AnswerTree, AnswerTrees, _size


def brute_force_match(answers: list[list[int]], context: list[int], depth: int, k: int,
                      min_match: int) -> tuple[int, dict[int, int]]:
    """The longest tail of ``context`` (at most ``depth - min(k, depth // 2)`` tokens) that
    occurs in a stored answer followed by a token, and the counts of those next tokens
    (suffixes cut to ``depth`` tokens, as the tree keeps them)."""
    longest = min(depth - min(k, depth // 2), len(context))
    for m in range(longest, max(min_match, 1) - 1, -1):
        tail = context[len(context) - m:]
        nexts: dict[int, int] = {}
        for a in answers:
            for start in range(len(a)):
                window = a[start:start + depth]
                if window[:m] == tail and len(window) > m:
                    nexts[window[m]] = nexts.get(window[m], 0) + 1
        if nexts:
            return m, nexts
    return 0, {}


@pytest.mark.parametrize("seed", range(8))
def test_tree_matches_the_longest_tail_and_follows_the_most_frequent_answer(seed):
    rng = random.Random(seed)
    vocab, depth, k = rng.choice([3, 5, 12]), rng.randint(4, 10), rng.randint(1, 4)
    tree = AnswerTree(depth, max_answers=6, min_probability=1e-9)
    kept: list[list[int]] = []
    for _ in range(20):
        answer = [rng.randrange(vocab) for _ in range(rng.randint(1, 15))]
        tree.add(answer)
        kept = (kept + [answer])[-6:]  # first in, first out
        assert tree.num_nodes == _size(tree._root)
        for _ in range(5):
            context = [rng.randrange(vocab) for _ in range(rng.randint(0, 12))]
            m, nexts = brute_force_match(kept, context, depth, k, 1)
            found = tree.propose(context, k)
            if m == 0:
                assert found is None
                continue
            assert found is not None and found.matched == m
            assert nexts[found.tokens[0]] == max(nexts.values())
            assert 1 <= len(found.tokens) <= min(k, m)
            # every draft is a path that some stored answer wrote after the matched tail
            tail = context[len(context) - m:]
            assert any(a[s:s + m + len(found.tokens)] == tail + list(found.tokens)
                       for a in kept for s in range(len(a)))


def test_tree_bounds_and_removal():
    tree = AnswerTree(depth=6, max_answers=3, min_probability=0.1)
    tree.add([1, 2, 3, 4, 5, 6, 7, 8])
    assert tree.propose([9, 1, 2, 3], 4).tokens == (4, 5, 6)  # no longer than the match
    for i in range(3):
        tree.add([50 + i] * 8)  # a fourth answer: the oldest leaves
    assert tree.num_answers == 3 and tree.propose([1, 2, 3], 4) is None
    assert tree.num_nodes == _size(tree._root)
    while tree.num_answers:
        tree.pop_oldest()
    assert tree.num_nodes == 1 and tree.num_tokens == 0  # nothing left behind
    frequent = AnswerTree(depth=8, max_answers=10, min_probability=0.5)
    for tail in (7, 7, 7, 8):
        frequent.add([1, 2, 3, tail, 9])
    draft = frequent.propose([1, 2, 3], 3)
    assert draft.tokens == (7, 9) and draft.expected == pytest.approx(0.75 + 0.75)
    with pytest.raises(ValueError):
        AnswerTree(1, 1, 0.5)


def test_trees_stay_under_their_bytes_oldest_answers_of_any_namespace_first():
    rng = random.Random(1)
    answers = [[rng.randrange(1000) for _ in range(30)] for _ in range(40)]
    one = AnswerTree(8, 1000, 0.1)
    one.add(answers[0])
    budget = 5 * one.num_nodes * NODE_BYTES  # room for about five answers
    trees = AnswerTrees(budget, 8, 1000, 0.1)
    for i, a in enumerate(answers):
        trees.add("ab"[i % 2], a)
        assert trees.num_bytes <= budget
    kept = trees.stats()["answers"]
    assert 3 <= kept <= 6
    last = answers[-1]
    assert trees.get("b").propose(last[:5], 3).tokens == tuple(last[5:8])  # the newest stays
    assert trees.get("a").propose(answers[0][:5], 3) is None  # the oldest left
    for i in range(500):  # answers leaving by max_answers do not pile up in the order
        trees.add("c", [i, i + 1])
    assert len(trees._order) <= 2 * trees.stats()["answers"] + 64
    trees.drop(None)
    assert trees.stats() == {"namespaces": 0, "answers": 0, "tokens": 0, "nodes": 0,
                             "bytes": 0}


def fake_seq(tokens, namespace="a", prompt=None):
    prompt = len(tokens) if prompt is None else prompt
    return SimpleNamespace(tokens=list(tokens), num_prompt_tokens=prompt, constraint=None,
                           ngram=None, draft_key=None, draft_tokens=0,
                           accepted_tokens=0, request=SimpleNamespace(namespace=namespace),
                           num_output_tokens=len(tokens) - prompt,
                           output_ids=list(tokens[prompt:]))


def test_namespaces_never_draft_from_each_other():
    drafter = Drafter(SpeculativeConfig(method="suffix", adaptive=False, min_n=2))
    drafter.answered(fake_seq([5, 6, 1, 2, 3, 4, 5, 6, 7, 8], prompt=2))
    assert drafter.propose(fake_seq([9, 9, 1, 2, 3], "a"), 4, 1) == (4, 5, 6)
    assert drafter.propose(fake_seq([9, 9, 1, 2, 3], "b"), 4, 1) == ()
    drafter.forget("a")
    assert drafter.propose(fake_seq([9, 9, 1, 2, 3], "a"), 4, 1) == ()
    # the sequence's own context first, the tree where it matches a longer tail
    drafter.answered(fake_seq([1, 2, 3, 4, 5, 6, 7], prompt=0))
    own = fake_seq([3, 40, 41, 9, 3])  # its own context: 3 -> 40 (a 1-token match)
    assert drafter.propose(own, 2, 1) == ()  # below min_n = 2 in its own context...
    assert drafter.propose(fake_seq([2, 40, 9, 2, 3]), 2, 1) == (4, 5)  # ...the tree: 2 3


def test_step_cost_fit_and_break_even():
    cost = StepCost()
    assert cost.fit() is None
    for n in [1, 5, 8, 40, 3, 12] * 5:
        cost.observe(n, 0.024 + 0.002 * n)
    a, b = cost.fit()
    assert a == pytest.approx(0.024, rel=1e-6) and b == pytest.approx(0.002, rel=1e-6)
    assert cost.break_even(1) == pytest.approx(0.002 / 0.026)
    assert cost.break_even(8) == pytest.approx(0.002 / (0.003 + 0.002))
    flat = StepCost(prior_tokens=16)
    for _ in range(4):
        flat.observe(1, 0.017)  # one size only: b from the prior
    a, b = flat.fit()
    assert a + b == pytest.approx(0.017) and b == pytest.approx(a / 16)


def set_chance(drafter: Drafter, key: int, chance: float) -> None:
    drafter.kept._kept[key], drafter.kept._tested[key] = chance * 1000, 1000.0


def test_adaptive_length_follows_the_matched_length_and_load():
    drafter = Drafter(SpeculativeConfig(method="ngram", min_n=1, max_n=32, num_tokens=8))
    for n in [1, 8, 40] * 5:
        drafter.cost.observe(n, 0.024 + 0.0024 * n)
    cycle = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    copying = fake_seq(cycle * 2 + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # a 22-token match
    long_key = KeptChance.key(False, 22)
    assert long_key == KeptChance.key(False, MATCH_BUCKETS)  # long tails share the last bucket
    set_chance(drafter, long_key, 0.8)
    assert drafter.propose(copying, 8, 1) == (11, 12, 1, 2, 3, 4, 5, 6)  # 0.8^8 = 0.17 > 0.09
    assert len(drafter.propose(copying, 8, 8)) == 3  # 8 decoding: 0.8, 0.64, 0.51 > 0.44
    assert copying.draft_key == long_key
    coincidence = fake_seq([5, 7, 9, 11, 8, 5])  # a one-token match: 5 -> 7 9 11 8 5
    set_chance(drafter, KeptChance.key(False, 1), 0.25)
    assert drafter.propose(coincidence, 8, 1) == (7,)  # 0.25 > 0.09 > 0.0625
    before = drafter.kept.chance(KeptChance.key(False, 1))
    assert drafter.propose(coincidence, 8, 8) == ()  # under load: nothing pays...
    assert drafter.kept.chance(KeptChance.key(False, 1)) > before  # ...drifting to the prior
    drafter.verified(copying, 4, 3)
    assert drafter.figures.as_dict()["acceptance_rate"] == 0.75
    assert copying.draft_tokens == 4 and copying.accepted_tokens == 3


def test_kept_chance_counts_the_tokens_tested_not_those_after_a_miss():
    """Greedy verification stops at the first rejected draft: the tokens after it were never
    tested, so the estimate is the chance to keep a token once the one before was kept
    (kept / (kept + the first miss)), not the share of the drafted tokens kept; each
    bucket counts apart, and a verification of a forced draft counts in none."""
    drafter = Drafter(SpeculativeConfig(method="ngram", min_n=1, num_tokens=8))
    seq = fake_seq([1, 2, 3])
    key = seq.draft_key = KeptChance.key(False, 3)
    drafter.verified(seq, 8, 2)  # 2 kept, the third missed: 2 of 3 tested
    assert drafter.kept.chance(key) == pytest.approx((PRIOR_KEPT * 0.99 + 2)
                                                     / (PRIOR_TESTED * 0.99 + 3))
    drafter.verified(seq, 8, 8)  # all kept: no miss
    kept, tested = (PRIOR_KEPT * 0.99 + 2) * 0.99 + 8, (PRIOR_TESTED * 0.99 + 3) * 0.99 + 8
    assert drafter.kept.chance(key) == pytest.approx(kept / tested)
    other = KeptChance.key(True, 3)
    assert drafter.kept.chance(other) == PRIOR_KEPT / PRIOR_TESTED  # the tree's bucket apart
    seq.draft_key = None  # a grammar's forced tokens
    drafter.verified(seq, 4, 4)
    assert drafter.kept.chance(key) == pytest.approx(kept / tested)
    assert drafter.figures.as_dict()["acceptance_rate"] == pytest.approx(14 / 20)
    assert drafter.stats()["kept_chance_by_match"]["context"][2] == pytest.approx(
        kept / tested, abs=1e-3)
