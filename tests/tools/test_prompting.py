"""``generic_tools_prompt`` and the canonical schema text it shares with the constraints."""

from __future__ import annotations

import json

import pytest

from hermes_async.tools import PARSERS, generic_tools_prompt
from hermes_async.tools.schema import canonical_json, tool_specs

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city (°C).",
        "parameters": {"type": "object", "required": ["city"],
                       "properties": {"unit": {"enum": ["c", "f"]}, "city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time"}},
]


def test_lists_every_tool_with_its_schema() -> None:
    text = generic_tools_prompt(TOOLS, "auto")
    assert "## get_weather\nWeather in a city (°C).\nParameters (JSON schema): " in text
    assert ('{"properties":{"unit":{"enum":["c","f"]},"city":{"type":"string"}},'
            '"required":["city"],"type":"object"}') in text
    assert '## get_time\nParameters (JSON schema): {"type":"object"}' in text
    assert text.index("get_weather") < text.index("get_time")  # the request's order


def test_says_how_to_call() -> None:
    text = generic_tools_prompt(TOOLS, "auto")
    assert '{"tool_calls": [{"name": "<tool name>", "arguments": {' in text
    assert "exactly one JSON object" in text and "nothing else" in text
    assert "plain text instead" in text
    required = generic_tools_prompt(TOOLS, "required")
    assert "must call at least one tool" in required and "plain text instead" not in required
    named = generic_tools_prompt(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert 'You must call the tool "get_time", once.' in named
    assert "Do not call any tool" in generic_tools_prompt(TOOLS, "none")


def test_deterministic() -> None:
    reordered = [{"function": {"parameters": dict(reversed(list(
        TOOLS[0]["function"]["parameters"].items()))), "description": "Weather in a city (°C).",
        "name": "get_weather"}, "type": "function"}, TOOLS[1]]
    assert generic_tools_prompt(TOOLS, "auto") == generic_tools_prompt(reordered, "auto")


def test_an_answer_in_the_documented_form_parses() -> None:
    answer = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}'
    (call,) = PARSERS["generic"]().parse(answer).tool_calls
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Oslo"})


def test_bad_tools() -> None:
    with pytest.raises(ValueError, match="not among the tools"):
        generic_tools_prompt(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ValueError, match="no function name"):
        generic_tools_prompt([{"type": "function"}], "auto")
    with pytest.raises(ValueError, match="must be a JSON schema object"):
        tool_specs([{"function": {"name": "f", "parameters": [1]}}])


def test_canonical_json() -> None:
    schema = {"type": "object", "properties": {"b": {"type": "string", "maxLength": 3},
                                               "a": {"properties": {"z": {}, "y": {}}}}}
    assert canonical_json(schema) == (
        '{"properties":{"b":{"maxLength":3,"type":"string"},"a":{"properties":{"z":{},"y":{}}}},'
        '"type":"object"}')
    assert canonical_json({"é": 1}) == '{"\\u00e9":1}'
    assert canonical_json({"é": 1}, ensure_ascii=False) == '{"é":1}'
    # a property named "properties" is a schema like any other
    odd = {"properties": {"properties": {"type": "object", "b": 1, "a": 2}}}
    assert canonical_json(odd) == '{"properties":{"properties":{"a":2,"b":1,"type":"object"}}}'
