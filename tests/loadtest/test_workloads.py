"""The load-test workloads: deterministic, and each shares (or does not share) exactly the
prompt prefix it claims to."""

from __future__ import annotations

import itertools
import os

import pytest
from workloads import (
    WORKLOADS,
    count_tokens,
    estimate_tokens,
    filler,
    make_workload,
    openai_body,
    workload_params,
)

NAMES = ("shared_system", "dynamic_field", "multi_turn", "tenants", "tool_calls", "no_reuse",
         "prefix_share")


def common_prefix(a: list | str, b: list | str) -> int:
    return len(os.path.commonprefix([a, b]))


def contents(req: dict) -> list:
    return [(m["role"], m.get("content")) for m in req["messages"]]


def test_the_named_workloads_exist_with_docstrings():
    assert set(NAMES) <= set(WORKLOADS)
    for name in NAMES:
        assert WORKLOADS[name].__doc__ and WORKLOADS[name].name == name


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_per_seed(name):
    a = list(make_workload(name, seed=3).iter_requests(6))
    b = list(make_workload(name, seed=3).iter_requests(6))
    c = list(make_workload(name, seed=4).iter_requests(6))
    assert a == b
    assert [contents(r) for r in a] != [contents(r) for r in c]
    for i, r in enumerate(a):
        assert r["meta"]["workload"] == name and r["meta"]["index"] == i
        assert r["max_tokens"] == 64 and r["messages"][-1]["role"] == "user"


def test_shared_system_shares_the_whole_system_prompt():
    reqs = list(make_workload("shared_system", system_tokens=300).iter_requests(8))
    systems = {r["messages"][0]["content"] for r in reqs}
    assert len(systems) == 1 and estimate_tokens(systems.pop()) == pytest.approx(300, rel=0.02)
    questions = [r["messages"][1]["content"] for r in reqs]
    assert len(set(questions)) == len(questions)


def test_dynamic_field_differs_only_in_the_timestamp_line(tokenizer):
    shared = make_workload("shared_system", system_tokens=200, tokenizer=tokenizer)
    dyn = make_workload("dynamic_field", system_tokens=200, tokenizer=tokenizer)
    reqs = list(dyn.iter_requests(5))
    firsts, rests = set(), set()
    for r in reqs:
        first, rest = r["messages"][0]["content"].split("\n", 1)
        assert first.startswith("Current time: 2026-") and first.endswith("Z")
        firsts.add(first)
        rests.add(rest)
    assert len(firsts) == 5 and rests == {shared.system}
    ids = [tokenizer.encode(r["messages"][0]["content"]) for r in reqs]
    for a, b in itertools.combinations(ids, 2):
        assert common_prefix(a, b) < 29  # + the template's 3 tokens < 32 (one KV block)
    # the questions are the shared_system ones
    same = list(shared.iter_requests(5))
    assert [r["messages"][1] for r in reqs] == [r["messages"][1] for r in same]


@pytest.mark.parametrize("tokens", [200, 1000])
def test_system_prompt_size_with_the_real_tokenizer(tokenizer, tokens):
    for name in ("shared_system", "tenants", "multi_turn", "tool_calls"):
        wl = make_workload(name, system_tokens=tokens, tokenizer=tokenizer)
        system = wl.next_request()["messages"][0]["content"]
        assert count_tokens(system, tokenizer) == pytest.approx(tokens, rel=0.02), name


def test_filler_sizes_without_a_tokenizer():
    import random

    text = filler(random.Random(0), 500)
    assert estimate_tokens(text) == pytest.approx(500, rel=0.01)
    assert text == filler(random.Random(0), 500)


def test_multi_turn_resends_the_history_with_the_answers():
    wl = make_workload("multi_turn", users=2, turns=3, system_tokens=50)
    seen: dict[int, list[dict]] = {}
    for i in range(8):
        req = wl.next_request()
        user, turn = req["meta"]["user"], req["meta"]["turn"]
        prev = seen.get(user)
        if prev is not None and turn > 0:
            assert req["messages"][: len(prev["messages"])] == prev["messages"]
            answer = req["messages"][len(prev["messages"])]
            assert answer == {"role": "assistant", "content": f"answer {prev['meta']['index']}"}
            assert len(req["messages"]) == len(prev["messages"]) + 2
        else:
            assert len(req["messages"]) == 2  # system + the first question
        seen[user] = req
        wl.record_response(req, f"answer {i}")
    # after 3 turns each conversation started afresh
    assert [(r["meta"]["turn"], r["meta"]["conversation"]) for r in seen.values()] == [(0, 1)] * 2


def test_multi_turn_starts_another_user_while_all_are_in_flight():
    wl = make_workload("multi_turn", users=2)
    reqs = [wl.next_request() for _ in range(3)]  # nothing answered yet
    assert [r["meta"]["user"] for r in reqs] == [0, 1, 2]
    wl.record_response(reqs[1], None)
    nxt = wl.next_request()
    assert nxt["meta"]["user"] == 1 and nxt["meta"]["turn"] == 1
    assert nxt["messages"][2]["role"] == "assistant" and nxt["messages"][2]["content"]


def test_tenants_have_disjoint_system_prompts(tokenizer):
    wl = make_workload("tenants", tenants=4, system_tokens=200, tokenizer=tokenizer)
    reqs = list(wl.iter_requests(24))
    by_tenant = {r["meta"]["tenant"]: r["messages"][0]["content"] for r in reqs}
    assert set(by_tenant) == {0, 1, 2, 3}
    ids = [tokenizer.encode(s) for s in by_tenant.values()]
    for a, b in itertools.combinations(ids, 2):
        assert common_prefix(a, b) < 16
    rr = make_workload("tenants", tenants=3, order="round_robin")
    assert [r["meta"]["tenant"] for r in rr.iter_requests(6)] == [0, 1, 2, 0, 1, 2]


def test_tool_calls_carry_tools_a_call_and_its_result():
    for req in make_workload("tool_calls", system_tokens=50).iter_requests(6):
        roles = [m["role"] for m in req["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "user"]
        assert req["tools"] and all(t["type"] == "function" for t in req["tools"])
        call = req["messages"][2]["tool_calls"][0]
        assert call["function"]["name"] in {t["function"]["name"] for t in req["tools"]}
        assert isinstance(call["function"]["arguments"], str)
        assert req["messages"][3]["tool_call_id"] == call["id"]
        assert openai_body(req, "m")["tools"] == req["tools"]


def test_no_reuse_prompts_share_no_long_prefix(tokenizer):
    reqs = list(make_workload("no_reuse", tokenizer=tokenizer).iter_requests(20))
    texts = [r["messages"][0]["content"] for r in reqs]
    assert [r["messages"][0]["role"] for r in reqs] == ["user"] * 20
    for t in texts:
        assert 28 <= count_tokens(t, tokenizer) <= 104
    for a, b in itertools.combinations(texts, 2):
        assert common_prefix(a, b) < 8


def test_prefix_share_shares_the_given_fraction(tokenizer):
    wl = make_workload("prefix_share", share=0.5, prompt_tokens=400, tokenizer=tokenizer)
    ids = [tokenizer.encode(r["messages"][0]["content"]) for r in wl.iter_requests(4)]
    for a, b in itertools.combinations(ids, 2):
        assert 195 <= common_prefix(a, b) <= 215
    assert all(abs(len(x) - 400) <= 12 for x in ids)
    none = make_workload("prefix_share", share=0.0, prompt_tokens=100)
    texts = [r["messages"][0]["content"] for r in none.iter_requests(4)]
    assert all(common_prefix(a, b) < 8 for a, b in itertools.combinations(texts, 2))
    with pytest.raises(ValueError):
        make_workload("prefix_share", share=1.5)


def test_make_workload_params():
    with pytest.raises(ValueError, match="unknown workload"):
        make_workload("nope")
    with pytest.raises(TypeError):
        make_workload("no_reuse", system_tokens=10)
    wl = make_workload("no_reuse", strict=False, system_tokens=10, max_tokens=5, seed=None)
    assert wl.next_request()["max_tokens"] == 5
    assert {"system_tokens", "seed", "max_tokens", "tokenizer"} <= workload_params("tenants")


def test_openai_body_streams_with_usage():
    req = make_workload("shared_system", system_tokens=20, max_tokens=7).next_request()
    body = openai_body(req, "m", ignore_eos=True)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 7 and body["ignore_eos"] is True and "meta" not in body
    assert "tools" not in body
    assert "stream_options" not in openai_body(req, "m", stream=False)
