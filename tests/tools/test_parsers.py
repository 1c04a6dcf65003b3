"""Whole-output parsing, per format: one call, parallel calls, leading text, malformed markup."""

from __future__ import annotations

import json
import re

import pytest

from hermes_async.tools import PARSERS, ParsedOutput, ToolCall

OPENAI_ID = re.compile(r"call_[0-9a-f]{24}")
MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")


def parse(fmt: str, text: str) -> ParsedOutput:
    return PARSERS[fmt]().parse(text)


def calls(out: ParsedOutput) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in out.tool_calls]


def test_parsers_are_named_as_registered() -> None:
    assert sorted(PARSERS) == ["generic", "hermes", "llama3_json", "mistral"]
    for name, factory in PARSERS.items():
        assert factory().name == name
    with pytest.raises(TypeError):
        PARSERS["x"] = PARSERS["hermes"]  # type: ignore[index]


# -- hermes -----------------------------------------------------------------------------------

def test_hermes_single() -> None:
    out = parse("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
                          "\n</tool_call>")
    assert out.content is None
    assert calls(out) == [("get_weather", '{"city": "Paris"}')]
    assert OPENAI_ID.fullmatch(out.tool_calls[0].id)


def test_hermes_parallel_with_leading_content() -> None:
    text = ('Let me look.\n<tool_call>\n{"name": "a", "arguments": {"x": [1, 2]}}\n</tool_call>\n'
            '<tool_call>\n{"arguments": {}, "name": "b"}\n</tool_call>')
    out = parse("hermes", text)
    assert out.content == "Let me look.\n\n"
    assert calls(out) == [("a", '{"x": [1, 2]}'), ("b", "{}")]
    assert out.tool_calls[0].id != out.tool_calls[1].id


def test_hermes_lenient_shapes() -> None:
    # arguments given as a JSON string; no arguments; closing tag cut off at the very end
    out = parse("hermes", '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
                          '<tool_call>{"name": "g"}</tool_call><tool_call>{"name": "h", '
                          '"arguments": {"z": null}}\n</tool_')
    assert calls(out) == [("f", '{"a": 1}'), ("g", "{}"), ("h", '{"z": null}')]


@pytest.mark.parametrize("text", [
    "<tool_call>\nnot json\n</tool_call>",
    '<tool_call>\n{"name": "f", "arguments": {"x": }}\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": {"x": 1}',  # cut off inside the call
    '<tool_call>\n{"arguments": {"x": 1}}\n</tool_call>',  # no name
    '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',  # arguments not an object
    '<tool_call>\n{"name": "f", "arguments": {}} trailing\n</tool_call>',
    "a < b <tool_ and </tool_call>",
])
def test_hermes_malformed_is_content(text: str) -> None:
    assert parse("hermes", text) == ParsedOutput(text, ())


def test_hermes_malformed_then_good_block() -> None:
    bad = '<tool_call>\n{"name": "f", "arguments": {"x": }}\n</tool_call>\n'
    good = '<tool_call>\n{"name": "g", "arguments": {"y": 2}}\n</tool_call>'
    out = parse("hermes", bad + good)
    assert out.content == bad
    assert calls(out) == [("g", '{"y": 2}')]


def test_plain_text_and_empty() -> None:
    for fmt in PARSERS:
        assert parse(fmt, "Hello there.") == ParsedOutput("Hello there.", ())
        assert parse(fmt, "") == ParsedOutput("", ())
        assert parse(fmt, "  \n") == ParsedOutput("  \n", ())


# -- llama3_json ------------------------------------------------------------------------------

def test_llama3_single_with_and_without_tag() -> None:
    for prefix in ("", "<|python_tag|>", "  "):
        out = parse("llama3_json", prefix + '{"name": "f", "parameters": {"q": "x"}}')
        assert out.content is None
        assert calls(out) == [("f", '{"q": "x"}')]


def test_llama3_parallel() -> None:
    text = ('{"name": "a", "parameters": {"n": 1}}; {"name": "b", "arguments": {}}\n'
            '{"type": "function", "name": "c", "parameters": {"s": "t"}}\n')
    out = parse("llama3_json", text)
    assert out.content is None
    assert calls(out) == [("a", '{"n": 1}'), ("b", "{}"), ("c", '{"s": "t"}')]


def test_llama3_leading_content_needs_the_tag() -> None:
    out = parse("llama3_json", 'Checking. <|python_tag|>{"name": "f", "parameters": {}}')
    assert out.content == "Checking. "
    assert calls(out) == [("f", "{}")]
    text = 'Checking. {"name": "f", "parameters": {}}'
    assert parse("llama3_json", text) == ParsedOutput(text, ())


@pytest.mark.parametrize("text", [
    '{"location": "Paris"}',  # a JSON answer, not a call
    '{"name": "Bob", "age": 3}',
    '{"name": "f"}',  # no parameters without the tag
    '{"name": "f", "parameters": {"a": 1}',
    '<|python_tag|>brave_search.call(query="weather")',
])
def test_llama3_malformed_is_content(text: str) -> None:
    assert parse("llama3_json", text) == ParsedOutput(text, ())


def test_llama3_text_after_calls_is_content() -> None:
    out = parse("llama3_json", '{"name": "f", "parameters": {}}; then {"x": 1}')
    assert calls(out) == [("f", "{}")]
    assert out.content == "; then {\"x\": 1}"


# -- mistral ----------------------------------------------------------------------------------

def test_mistral_array_single_and_parallel() -> None:
    out = parse("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]')
    assert out.content is None
    assert calls(out) == [("f", '{"a": 1}')]
    assert MISTRAL_ID.fullmatch(out.tool_calls[0].id)
    out = parse("mistral", '[TOOL_CALLS][{"id": "abcDEF123", "name": "f", "arguments": {}}, '
                           '{"name": "g", "arguments": {"b": "c"}}]')
    assert calls(out) == [("f", "{}"), ("g", '{"b": "c"}')]
    assert out.tool_calls[0].id == "abcDEF123"
    assert MISTRAL_ID.fullmatch(out.tool_calls[1].id)


def test_mistral_args_format_with_leading_content() -> None:
    out = parse("mistral", 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
                           "[TOOL_CALLS]now[CALL_ID]Zz9Zz9Zz9[ARGS]{}")
    assert out.content == "Sure."
    assert calls(out) == [("get_weather", '{"city": "Paris"}'), ("now", "{}")]
    assert out.tool_calls[1].id == "Zz9Zz9Zz9"


@pytest.mark.parametrize("text", [
    "[TOOL_CALLS][]",
    "[TOOL_CALLS] not json",
    '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"nam',
    "[TOOL_CALLS]f[ARGS]{oops}",
    "[TOOL_CALLS]f[ARGS]",
    "see [TOOL_CALL",
])
def test_mistral_malformed_is_content(text: str) -> None:
    assert parse("mistral", text) == ParsedOutput(text, ())


# -- generic ----------------------------------------------------------------------------------

def test_generic_forms() -> None:
    out = parse("generic", ' {"tool_calls": [{"name": "f", "arguments": {"a": 1}}]}\n')
    assert out == ParsedOutput(None, (ToolCall(out.tool_calls[0].id, "f", '{"a": 1}'),))
    out = parse("generic", '{"tool_calls":[{"name":"f","arguments":{}},'
                           '{"arguments":{"b":[true]},"name":"g"}]}')
    assert calls(out) == [("f", "{}"), ("g", '{"b":[true]}')]
    assert calls(parse("generic", '{"tool_call": {"name": "f", "arguments": {}}}')) == [
        ("f", "{}")]
    assert calls(parse("generic", '{"name": "f", "arguments": {"k": "v"}}')) == [
        ("f", '{"k": "v"}')]


@pytest.mark.parametrize("text", [
    '{"answer": 42}',
    '{"name": "Bob", "age": 3}',
    '{"tool_calls": []}',
    '{"tool_calls": [{"name": "f", "arguments": {"a": 1}}, {"name": 3}]}',
    'Sure: {"tool_calls": [{"name": "f", "arguments": {}}]}',  # must start the output
    '{"tool_calls": [{"name": "f", "arguments": {"a": ',
])
def test_generic_malformed_is_content(text: str) -> None:
    assert parse("generic", text) == ParsedOutput(text, ())


def test_arguments_are_valid_json_text_as_written() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"b" :  [1,\n 2], "a": "\\u00e9"}}</tool_call>'
    (call,) = parse("hermes", text).tool_calls
    assert call.arguments == '{"b" :  [1,\n 2], "a": "\\u00e9"}'
    assert json.loads(call.arguments) == {"b": [1, 2], "a": "é"}
