"""Speculative decoding over HTTP, with the official ``openai`` client against the default
model: the same greedy answers as a server without it (streamed and not), OpenAI's
``completion_tokens_details`` (accepted / rejected prediction tokens) in ``usage``, the
acceptance figures on ``/cache/stats`` and ``/metrics``, and nothing held afterwards."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import openai
import pytest

from hermes_async.config import SpeculativeConfig
from tests.server.helpers import ServerThread, engine_idle, real_config, request, request_json

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["Repeat this sentence exactly: The keeper climbed the stairs to clean the lamp.",
           'Write this JSON again with "age" set to 41: {"name": "Ada", "age": 40, '
           '"city": "Oslo", "tags": ["a", "b"]}']


@pytest.fixture(scope="module")
def spec_server(default_model_dir: Path):
    config = dataclasses.replace(real_config(default_model_dir),
                                 speculative=SpeculativeConfig(method="suffix"))
    srv = ServerThread(config).start()
    yield srv
    srv.stop()


def answers(base_url: str, stream: bool = False) -> list[tuple[str, Any]]:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    out = []
    for prompt in PROMPTS:
        kw: dict[str, Any] = {"model": MODEL, "temperature": 0.0, "max_tokens": 48,
                              "messages": [{"role": "user", "content": prompt}]}
        if stream:
            text, usage = "", None
            for chunk in client.chat.completions.create(
                    stream=True, stream_options={"include_usage": True}, **kw):
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                usage = chunk.usage or usage
            out.append((text, usage))
        else:
            r = client.chat.completions.create(**kw)
            out.append((r.choices[0].message.content, r.usage))
    return out


def test_answers_usage_and_figures_with_speculation(server: Any, spec_server: Any) -> None:
    plain = answers(server.base_url)
    for stream in (False, True):
        got = answers(spec_server.base_url, stream=stream)
        assert [t for t, _ in got] == [t for t, _ in plain]
        drafted = 0
        for (_, usage), (_, ref) in zip(got, plain, strict=True):
            assert usage.completion_tokens == ref.completion_tokens
            details = usage.completion_tokens_details
            if details is not None:  # present where drafts were verified
                assert details.accepted_prediction_tokens >= 0
                assert details.rejected_prediction_tokens >= 0
                assert details.accepted_prediction_tokens < usage.completion_tokens
                drafted += details.accepted_prediction_tokens + \
                    details.rejected_prediction_tokens
        assert drafted > 0
    assert all(ref.completion_tokens_details is None for _, ref in plain)
    doc = request_json(f"{spec_server.url}/cache/stats")[2]
    stats = doc["speculative"]
    assert stats["method"] == "suffix" and stats["draft_tokens"] > 0
    assert 0 < stats["acceptance_rate"] <= 1
    assert stats["answer_trees"]["answers"] == 2 * len(PROMPTS)  # each answer stored
    metrics = request(f"{spec_server.url}/metrics")[2].decode()
    assert "hermes_spec_decode_num_accepted_tokens_total" in metrics
    idle = spec_server.call(lambda: engine_idle(spec_server.engine))
    assert idle == dict.fromkeys(idle, 0)
