"""The dynamic-field detector against a real prefix tree and the real tokenizer."""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import pytest

from hermes_async.observe.divergence import DivergenceDetector
from tests.observe.conftest import CacheSim

BODY = "".join(f"规则{i}：请用简洁、礼貌的语言回答用户关于产品{i}的问题，并给出步骤。"
               for i in range(10))
QUESTIONS = ["What is the capital of France?", "How do I reset my password?",
             "Explain prefix caching in two sentences.", "写一首关于秋天的短诗。",
             "Why is the sky blue?", "List three prime numbers.", "Who wrote Hamlet?"]


def chat_ids(tok: Any, system: str, question: str) -> list[int]:
    out = tok.apply_chat_template([{"role": "system", "content": system},
                                   {"role": "user", "content": question}],
                                  add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def stamp(k: int) -> str:
    return f"2026-01-{k + 1:02d} 10:{k * 7 % 60:02d}:{k * 13 % 60:02d}"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_timestamp_at_start_of_system_prompt(tokenizer: Any) -> None:
    det = DivergenceDetector(32, tokenizer.decode)
    sim = CacheSim(det)
    prompts = [chat_ids(tokenizer, f"当前日期：{stamp(k)}。" + BODY, QUESTIONS[k % 7])
               for k in range(20)]
    assert 550 < len(prompts[0]) < 700
    results = [sim.send(p) for p in prompts]
    assert results[0] is None and all(r is not None for r in results[1:])
    assert all(m == 0 for m in sim.matched)  # the stamp is in block 0: the cache never hits
    rep = det.report("ns")
    assert len(rep.points) == 1
    pt = rep.points[0]
    prefix_len = len(tokenizer.encode("<|im_start|>system\n当前日期：2026-01-"))
    assert prefix_len - 2 <= pt.position <= prefix_len + 1 and pt.block == 0
    assert pt.requests == 19 and pt.tokens_lost > 19 * 500
    assert "20 10:13:07" in pt.text_this and "19 10:06:54" in pt.text_other
    assert "当前日期：2026-01-" in pt.text_before and pt.text_after.startswith("。规则0")
    d = pt.to_dict()
    assert "当前日期：2026-01-20 10:13:07。" in d["excerpt_this"]
    assert "当前日期：2026-01-19 10:06:54。" in d["excerpt_other"]
    json.dumps(rep.to_dict(), ensure_ascii=False)
    assert rep.prompts_seen == 20 and rep.short_prompts == 0
    assert rep.prefill_tokens == sum(map(len, prompts))
    assert rep.share(pt) > 0.8


def test_date_in_the_middle(tokenizer: Any) -> None:
    det = DivergenceDetector(32, tokenizer.decode)
    sim = CacheSim(det)
    head = BODY[: len(BODY) // 2]
    prompts = [chat_ids(tokenizer, head + f"今天是2026年1月{k + 1}日。" + BODY, QUESTIONS[k % 7])
               for k in range(8)]
    for p in prompts:
        sim.send(p)
    assert all(m >= 288 for m in sim.matched[1:])  # the head before the date still hits
    [pt] = det.report("ns").points
    pos = len(tokenizer.encode("<|im_start|>system\n" + head + "今天是2026年1月"))
    assert pt.position in (pos, pos + 1) and pt.position > 300
    assert pt.block == pt.position // 32 and pt.requests == 7
    assert pt.text_this == "8" and pt.text_other == "7"
    assert pt.text_before.endswith("今天是2026年1月") and pt.text_after.startswith("日。")


def test_fixed_system_prompt_varied_questions_gives_no_points(tokenizer: Any) -> None:
    det = DivergenceDetector(32, tokenizer.decode)
    sim = CacheSim(det)
    rng = random.Random(1)
    for k in range(40):
        q = rng.choice(QUESTIONS) + " " + " ".join(rng.choice(QUESTIONS) for _ in range(k % 4))
        assert sim.send(chat_ids(tokenizer, "You are a careful assistant. " + BODY, q)) is None
    assert det.report("ns").points == []
    assert min(sim.matched[1:]) > 500


def test_totally_different_prompts_give_no_points() -> None:
    det = DivergenceDetector(16, str)
    sim = CacheSim(det)
    rng = random.Random(2)
    for _ in range(50):
        assert sim.send([rng.randrange(1000) for _ in range(rng.randrange(20, 300))]) is None
    assert det.report("ns").points == []
    assert det.candidate_checks < 5  # random blocks practically never share an index key


def test_no_point_when_only_eviction_caused_the_miss() -> None:
    """Same prompt again after the cache lost it (matched 0): no field differs."""
    det = DivergenceDetector(4, str)
    prompt = list(range(100, 140))
    det.observe("ns", prompt, 0)
    assert det.observe("ns", prompt, 0) is None
    assert det.report("ns").points == []


def test_short_prompts_are_counted() -> None:
    det = DivergenceDetector(16, str)
    sim = CacheSim(det)
    for n in (1, 5, 16, 17, 40, 33):
        sim.send(list(range(n)))
    rep = det.report("ns")
    assert rep.short_prompts == 3 and rep.prompts_seen == 6
    assert det.report("other").short_prompts == 0


def test_timestamp_whose_token_count_changes_is_found_by_shift() -> None:
    """``9`` -> ``10``: one more token shifts every later block by one."""
    det = DivergenceDetector(4, lambda ids: " ".join(map(str, ids)))
    sim = CacheSim(det)
    head, tail = list(range(500, 506)), list(range(600, 640))
    sim.send(head + [9] + tail + [1, 2])
    pt = sim.send(head + [1, 0] + tail + [3, 4])
    assert pt is not None and pt.position == 6 and pt.text_this == "1 0"
    assert pt.text_other == "9" and pt.tokens_lost >= 32


def test_two_dynamic_fields_give_two_points() -> None:
    det = DivergenceDetector(4, lambda ids: " ".join(map(str, ids)))
    sim = CacheSim(det)
    for k in range(6):
        sim.send([1] * 10 + [100 + k] + [2] * 30 + [200 + k] + [3] * 40 + [300 + k, 5])
    pts = sorted(det.report("ns").points, key=lambda p: p.position)
    assert [(p.position, p.requests) for p in pts] == [(10, 5), (41, 5)]
    assert pts[1].tokens_lost > pts[0].tokens_lost > 0
    assert pts[0].text_this == "105" and pts[0].text_other == "104"


def test_warning_logged_once_when_over_share(tokenizer: Any,
                                             caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    det = DivergenceDetector(32, tokenizer.decode, warn_share=0.1, clock=clock,
                             warn_interval_s=600)
    sim = CacheSim(det)
    with caplog.at_level(logging.WARNING, logger="hermes_async.cache"):
        for k in range(20):
            clock.now += 1
            sim.send(chat_ids(tokenizer, f"当前日期：{stamp(k)}。" + BODY, QUESTIONS[k % 7]))
    warnings = [r for r in caplog.records if r.name == "hermes_async.cache"]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert "last user message" in msg and "system prompt" in msg and "token" in msg
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hermes_async.cache"):
        clock.now += 601
        sim.send(chat_ids(tokenizer, f"当前日期：{stamp(30)}。" + BODY, QUESTIONS[0]))
    assert len([r for r in caplog.records if r.name == "hermes_async.cache"]) == 1


def test_no_warning_when_under_share(caplog: pytest.LogCaptureFixture) -> None:
    """A field followed by only two shared blocks in long, otherwise unique prompts."""
    det = DivergenceDetector(16, str, warn_share=0.3)
    sim = CacheSim(det)
    rng = random.Random(3)
    with caplog.at_level(logging.WARNING, logger="hermes_async.cache"):
        for k in range(20):
            unique = [rng.randrange(10_000, 20_000) for _ in range(200)]
            sim.send([7] * 20 + [k] + [8] * 40 + unique)
    rep = det.report("ns")
    [pt] = rep.points
    assert pt.requests == 19 and 0 < rep.share(pt) < 0.3
    assert not [r for r in caplog.records if r.name == "hermes_async.cache"]


def test_sample_window_eviction() -> None:
    det = DivergenceDetector(4, str, sample_size=4)
    sim = CacheSim(det)
    shared = list(range(1000, 1040))
    for k in range(3):
        sim.send([k] + shared)
    assert det.report("ns").points[0].requests == 2
    for k in range(4):  # unrelated prompts push the first three out of the window
        sim.send(list(range(5000 + 100 * k, 5050 + 100 * k)))
    rep = det.report("ns")
    assert rep.points == [] and rep.prompts_seen == 4
    before = det.candidate_checks
    assert det.observe("ns", [9] + shared, 0) is None  # nothing left to line up with
    assert det.candidate_checks == before
    assert rep.prefill_tokens == 4 * 50


def test_observe_cost_does_not_scale_with_sample_size() -> None:
    def checks(sample_size: int) -> list[int]:
        det = DivergenceDetector(16, str, sample_size=sample_size)
        sim = CacheSim(det)
        rng = random.Random(4)
        body = list(range(3000, 3400))
        out = []
        for k in range(600):
            before = det.candidate_checks
            tail = [rng.randrange(100) for _ in range(rng.randrange(5, 60))]
            sim.send([1, 2, 3, 10_000 + k] + body + tail)
            out.append(det.candidate_checks - before)
        return out

    small, big = checks(8), checks(1024)
    assert small == big
    assert max(big) <= 4 * 5 and sum(big) >= 599


def test_forget_and_namespaces() -> None:
    det = DivergenceDetector(4, str)
    det.observe("b", list(range(10)), 0)
    det.observe("a", list(range(10)), 8)
    assert det.namespaces() == ["a", "b"]
    det.forget("a")
    assert det.namespaces() == ["b"]
    det.forget()
    assert det.namespaces() == [] and det.report("b").prompts_seen == 0


def test_max_points_bound() -> None:
    det = DivergenceDetector(4, str, max_points=3)
    sim = CacheSim(det)
    for k in range(10):  # ten different fields, each seen twice
        body = [50 + k] * 8 + list(range(2000 + 100 * k, 2040 + 100 * k))
        for v in (1, 2):
            sim.send([90 + k] * (4 + 6 * k) + [k * 10 + v] + body)
    assert len(det.report("ns").points) == 3
