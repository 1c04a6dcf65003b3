"""``call_constraint``: the specs are canonical and valid for llguidance, and a matcher driven
by them accepts well-formed calls (which the same format's parser then reads back) and rejects
a wrong name or arguments that break the tool's schema."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hermes_async.tools import PARSERS, call_constraint
from hermes_async.tools.schema import canonical_json
from hermes_async.types import GuideKind, StructuredOutput

llguidance = pytest.importorskip("llguidance")
LLMatcher = llguidance.LLMatcher

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time"}},  # no parameters: any object
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ARGS_KEY = {"generic": "arguments", "hermes": "arguments", "llama3_json": "parameters",
            "mistral": "arguments"}


def render(fmt: str, calls: list[tuple[str, str]]) -> str:
    """Calls written as the format's model would write them (and as the constraint allows)."""
    key = ARGS_KEY[fmt]
    objs = [f'{{"name": "{name}", "{key}": {args}}}' for name, args in calls]
    if fmt == "generic":
        return '{"tool_calls": [' + ", ".join(objs) + "]}"
    if fmt == "hermes":
        return "\n".join(f"<tool_call>\n{o}\n</tool_call>" for o in objs)
    if fmt == "llama3_json":
        return "; ".join(objs)
    return "[TOOL_CALLS][" + ", ".join(objs) + "]"


def _json_payloads(constraint: StructuredOutput) -> list[str]:
    if constraint.kind == GuideKind.JSON:
        return [constraint.spec]
    decoder, spec, out = json.JSONDecoder(), constraint.spec, []
    start = spec.find("%json ")
    while start >= 0:
        _, end = decoder.raw_decode(spec, start + len("%json "))
        out.append(spec[start + len("%json "):end])
        start = spec.find("%json ", end)
    return out


def grammar_text_for(constraint: StructuredOutput) -> str:
    if constraint.kind == GuideKind.JSON:
        return LLMatcher.grammar_from_json_schema(constraint.spec)
    assert constraint.kind == GuideKind.GRAMMAR
    return LLMatcher.grammar_from_lark(constraint.spec)


@pytest.fixture(scope="module")
def ll_tokenizer(hf_tokenizer: Any) -> Any:
    import llguidance.hf

    return llguidance.hf.from_tokenizer(hf_tokenizer)


def accepts(ll_tokenizer: Any, hf_tokenizer: Any, constraint: StructuredOutput,
            text: str) -> bool:
    matcher = LLMatcher(ll_tokenizer, grammar_text_for(constraint), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ok = matcher.consume_tokens(hf_tokenizer.encode(text))
    return bool(ok) and matcher.is_accepting()


def test_generic_schema_is_the_documented_one() -> None:
    c = call_constraint("generic", TOOLS, "required")
    assert c.kind == GuideKind.JSON
    per_tool = [{"type": "object", "properties": {"name": {"const": n}, "arguments": p},
                 "required": ["name", "arguments"], "additionalProperties": False}
                for n, p in (("get_weather", WEATHER), ("get_time", {"type": "object"}))]
    assert json.loads(c.spec) == {
        "type": "object", "required": ["tool_calls"], "additionalProperties": False,
        "properties": {"tool_calls": {"type": "array", "minItems": 1, "maxItems": 8,
                                      "items": {"anyOf": per_tool}}}}
    named = json.loads(call_constraint("generic", TOOLS, NAMED).spec)
    assert named["properties"]["tool_calls"]["maxItems"] == 1
    single = json.loads(call_constraint("generic", TOOLS, "required", max_calls=1).spec)
    assert single["properties"]["tool_calls"]["maxItems"] == 1
    assert named["properties"]["tool_calls"]["items"] == per_tool[0]


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_specs_are_canonical(fmt: str) -> None:
    reordered = [{"function": {"parameters": dict(reversed(list(WEATHER.items()))),
                               "name": "get_weather"}, "type": "function"}, TOOLS[1]]
    for choice in ("required", NAMED):
        a, b = call_constraint(fmt, TOOLS, choice), call_constraint(fmt, reordered, choice)
        assert a == b
        assert a.kind == (GuideKind.JSON if fmt == "generic" else GuideKind.GRAMMAR)
        for payload in _json_payloads(a):  # compact, sorted keys (properties keep order)
            assert payload == canonical_json(json.loads(payload))
            assert payload == json.dumps(json.loads(payload), separators=(",", ":"))
        # "name" comes before the arguments (llguidance keeps the schema's property order)
        assert a.spec.index('"name"') < a.spec.index(f'"{ARGS_KEY[fmt]}"')


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_constraints_are_valid_grammars(fmt: str, ll_tokenizer: Any) -> None:
    for choice in ("required", NAMED):
        c = call_constraint(fmt, TOOLS, choice)
        assert LLMatcher.validate_grammar(grammar_text_for(c), ll_tokenizer) == ""


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_required_drives_a_matcher(fmt: str, ll_tokenizer: Any, hf_tokenizer: Any) -> None:
    c = call_constraint(fmt, TOOLS, "required")
    good = [
        [("get_weather", '{"city": "Paris"}')],
        [("get_time", "{}"), ("get_weather", '{"city": "Oslo", "unit": "c"}')],
        [("get_time", '{"anything": [1, 2]}')],
    ]
    for calls in good:
        text = render(fmt, calls)
        assert accepts(ll_tokenizer, hf_tokenizer, c, text), text
        parsed = PARSERS[fmt]().parse(text)
        assert [(t.name, json.loads(t.arguments)) for t in parsed.tool_calls] == [
            (n, json.loads(a)) for n, a in calls]
    bad = [
        [("get_wether", '{"city": "Paris"}')],  # not a tool
        [("get_weather", '{"city": 3}')],  # wrong type
        [("get_weather", '{"unit": "c"}')],  # required property missing
        [("get_weather", '{"city": "P", "extra": 1}')],  # additionalProperties false
        [("get_weather", '{"city": "P", "unit": "k"}')],  # not in the enum
    ]
    for calls in bad:
        assert not accepts(ll_tokenizer, hf_tokenizer, c, render(fmt, calls)), calls
    assert not accepts(ll_tokenizer, hf_tokenizer, c, "Sure, let me check.")
    assert not accepts(ll_tokenizer, hf_tokenizer, c, render(fmt, [])[:0])  # no call at all


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_named_forces_exactly_that_call(fmt: str, ll_tokenizer: Any, hf_tokenizer: Any) -> None:
    c = call_constraint(fmt, TOOLS, NAMED)
    one = [("get_weather", '{"city": "Paris", "unit": "f"}')]
    assert accepts(ll_tokenizer, hf_tokenizer, c, render(fmt, one))
    assert not accepts(ll_tokenizer, hf_tokenizer, c, render(fmt, [("get_time", "{}")]))
    assert not accepts(ll_tokenizer, hf_tokenizer, c, render(fmt, one + one))  # exactly one
    assert not accepts(ll_tokenizer, hf_tokenizer, c,
                       render(fmt, [("get_weather", '{"city": null}')]))


def test_bad_requests() -> None:
    with pytest.raises(ValueError, match="choices: generic, hermes, llama3_json, mistral"):
        call_constraint("qwen", TOOLS, "required")
    for choice in ("auto", "none"):
        with pytest.raises(ValueError, match="forces no call"):
            call_constraint("hermes", TOOLS, choice)
    with pytest.raises(ValueError, match="not among the tools"):
        call_constraint("hermes", TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ValueError, match="at least one tool"):
        call_constraint("hermes", [], "required")
    with pytest.raises(ValueError, match="no function name"):
        call_constraint("hermes", [{"type": "function", "function": {}}], "required")
