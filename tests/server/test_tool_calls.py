"""Tool calls end to end: the official ``openai`` client against the real default model (its
template knows no tools, so the engine's generic tools prompt and parser are used); arguments
checked with ``jsonschema`` against each tool's parameters."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.server.helpers import engine_idle, request_json

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -1000,
                                              "maximum": 1000},
                                        "b": {"type": "integer", "minimum": -1000,
                                              "maximum": 1000}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                           "description": "Current weather in a city"}},
         {"type": "function", "function": {"name": "add", "parameters": ADD,
                                           "description": "Add two integers"}}]
PARAMS = {"get_weather": WEATHER, "add": ADD}
ASKS = ["What is the weather in Paris?", "Add 2 and 40.", "Is it raining in Tokyo?",
        "What is 7 plus 8?"]


@pytest.fixture
def client(server: Any):
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                       timeout=300) as c:
        yield c


def _check_calls(message: Any, names: set[str]) -> list[Any]:
    calls = message.tool_calls or []
    assert calls and message.content is None
    assert len({c.id for c in calls}) == len(calls)
    for call in calls:
        assert call.type == "function" and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
    return calls


def test_required_and_named_calls_validate(server: Any) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    cases = [(ask, t, choice) for ask in ASKS for t in (0.0, 1.0)
             for choice in ("required", named)]

    async def run() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused",
                                      max_retries=0, timeout=300) as c:
            return await asyncio.gather(*[c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": ask}], tools=TOOLS,
                tool_choice=choice, max_tokens=300, temperature=t, seed=3)
                for ask, t, choice in cases])

    for (ask, t, choice), r in zip(cases, asyncio.run(run()), strict=True):
        assert r.choices[0].finish_reason == "tool_calls", (ask, t, choice)
        if choice == "required":
            _check_calls(r.choices[0].message, set(PARAMS))
        else:
            assert len(_check_calls(r.choices[0].message, {"add"})) == 1


def test_streamed_calls_equal_the_whole_answer(client: Any, server: Any) -> None:
    msgs = [{"role": "user", "content": "Weather in Rome and in Oslo?"}]
    kw = {"model": MODEL, "messages": msgs, "tools": TOOLS, "tool_choice": "required",
          "max_tokens": 300, "temperature": 0}
    whole = client.chat.completions.create(**kw).choices[0].message
    calls: dict[int, dict[str, str]] = {}
    content, reason = "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        delta, reason = chunk.choices[0].delta, chunk.choices[0].finish_reason or reason
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": ""})
            if tc.function and tc.function.name:
                assert not entry["name"], "the name comes once, first"
                entry["name"], entry["id"] = tc.function.name, tc.id
            entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert reason == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == \
        [(c.function.name, c.function.arguments) for c in whole.tool_calls]
    assert server.call(lambda: engine_idle(server.engine))["requests"] == 0


def test_auto_none_and_round_trip(client: Any) -> None:
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS,
                                       tool_choice="auto", max_tokens=120, temperature=0)
    message = r.choices[0].message
    if message.tool_calls:
        _check_calls(message, set(PARAMS))
    else:
        assert "tool_calls" not in (message.content or "")
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS,
                                       tool_choice="none", max_tokens=30, temperature=0)
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason != "tool_calls"
    first = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS,
                                           tool_choice="required", max_tokens=300,
                                           temperature=0).choices[0].message
    call = first.tool_calls[0]
    follow = msgs + [first.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    r = client.chat.completions.create(model=MODEL, messages=follow, tools=TOOLS,
                                       max_tokens=40, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"),
])
def test_bad_tool_requests_are_400(server: Any, extra: dict[str, Any], param: str) -> None:
    status, _, body = request_json(f"{server.base_url}/chat/completions", {
        "model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
        **extra})
    assert status == 400, body
    assert body["error"]["param"] == param
