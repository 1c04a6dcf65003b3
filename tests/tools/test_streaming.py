"""Streaming invariants, with hypothesis: the same outputs split anywhere give the text and the
calls that ``parse`` gives.

- the ContentDelta texts add up to ``parse(text).content or ""``;
- each call has one ToolCallStart (name complete) and then ArgumentsDelta fragments adding up
  to the parsed arguments exactly; the stream's ids are distinct;
- well-formed outputs: the calls are the ones rendered (names, arguments text), and no call
  markup ever reaches a ContentDelta;
- malformed or cut-off outputs: the text still agrees with ``parse``, and parse's calls are
  among the stream's (a call found malformed after it started stays started);
- text is held back only while it could still be call markup.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_async.tools import PARSERS, ArgumentsDelta, ContentDelta, ToolCallStart
from tests.tools.conftest import run_stream

MARKUP = {"hermes": ["<tool_call>", "</tool_call>"], "mistral": ["[TOOL_CALLS]", "[ARGS]"],
          "llama3_json": ["<|python_tag|>", '"parameters"'], "generic": ['"tool_calls"']}
SETTINGS = settings(max_examples=int(os.environ.get("TOOLS_EXAMPLES", "150")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
scalars = (st.none() | st.booleans() | st.integers(-10**6, 10**6)
           | st.floats(allow_nan=False, allow_infinity=False, width=32)
           | st.text(max_size=8))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                           max_leaves=8)
arguments = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
# plain text rich in the characters call markup is made of
text_alphabet = st.sampled_from(list("ab <>/[]{}\"':;,\n_|") + ["<tool_", "[TOOL_", "<|python",
                                                                  "tool_call", "é"])
plain = st.lists(text_alphabet, max_size=12).map("".join)


@st.composite
def rendered_args(draw: Any) -> str:
    value = draw(arguments)
    style = draw(st.sampled_from(["compact", "spaced", "indent", "ascii"]))
    if style == "compact":
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if style == "indent":
        return json.dumps(value, indent=1)
    return json.dumps(value, ensure_ascii=style == "ascii")


@st.composite
def calls(draw: Any) -> list[tuple[str, str]]:
    return draw(st.lists(st.tuples(names, rendered_args()), min_size=1, max_size=3))


def _clean(text: str, fmt: str) -> str:
    for marker in MARKUP[fmt]:
        text = text.replace(marker, "")
    return text


@st.composite
def well_formed(draw: Any, fmt: str) -> tuple[str, list[tuple[str, str]]]:
    """A well-formed output of ``fmt`` and the calls it makes."""
    made = draw(calls())
    ws = draw(st.sampled_from(["", "\n", " ", "\n\n"]))
    lead = _clean(draw(plain), fmt)
    if fmt == "hermes":
        blocks = [f'<tool_call>{ws}{{"name": "{n}", "arguments": {a}}}{ws}</tool_call>'
                  for n, a in made]
        return lead + "\n".join(blocks) + draw(st.sampled_from(["", "\n"])), made
    if fmt == "mistral":
        if draw(st.booleans()):
            items = ", ".join(f'{{"name": "{n}", "arguments": {a}}}' for n, a in made)
            return f"{lead}[TOOL_CALLS]{ws}[{items}]", made
        return lead + "".join(f"[TOOL_CALLS]{n}[ARGS]{a}" for n, a in made), made
    if fmt == "llama3_json":
        sep = draw(st.sampled_from(["; ", ";", "\n", ";\n"]))
        body = sep.join(f'{{"name": "{n}", "parameters": {a}}}' for n, a in made)
        tagged = draw(st.booleans())
        head = (lead.rstrip() + "<|python_tag|>") if tagged else ws
        return head + body + draw(st.sampled_from(["", "\n"])), made
    items = ", ".join(f'{{"name": "{n}", "arguments": {a}}}' for n, a in made)
    return f'{ws}{{"tool_calls": [{items}]}}{ws}', made


@st.composite
def splits(draw: Any, text: str) -> list[str]:
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    return [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _check(fmt: str, text: str, pieces: list[str]) -> tuple[Any, Any]:
    parser = PARSERS[fmt]()
    parsed = parser.parse(text)
    got = run_stream(parser.stream(), pieces)
    assert got.content == (parsed.content or ""), (text, pieces)
    want = [(c.name, c.arguments) for c in parsed.tool_calls]
    it = iter(got.calls)
    assert all(call in it for call in want), "parse's calls are among the stream's, in order"
    for call in parsed.tool_calls:
        json.loads(call.arguments)
    return parsed, got


def _well_formed_test(fmt: str) -> Any:
    @SETTINGS
    @given(data=st.data())
    def test(data: Any) -> None:
        text, made = data.draw(well_formed(fmt))
        pieces = data.draw(splits(text))
        parsed, got = _check(fmt, text, pieces)
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == made, text
        assert got.calls == made
        for marker in MARKUP[fmt][:1]:
            assert marker not in got.content
        for ev in got.events:
            if isinstance(ev, ContentDelta):
                assert not any(m in ev.text for m in MARKUP[fmt][:1])
    return test


test_hermes_well_formed = _well_formed_test("hermes")
test_mistral_well_formed = _well_formed_test("mistral")
test_llama3_well_formed = _well_formed_test("llama3_json")
test_generic_well_formed = _well_formed_test("generic")


@SETTINGS
@given(data=st.data(), fmt=st.sampled_from(sorted(PARSERS)))
def test_any_text_agrees_with_parse(data: Any, fmt: str) -> None:
    """Cut-off, corrupted or spliced outputs: the stream's text still equals parse's."""
    text, _ = data.draw(well_formed(fmt))
    mode = data.draw(st.sampled_from(["cut", "corrupt", "splice", "plain"]))
    if mode == "cut":
        text = text[:data.draw(st.integers(0, len(text)))]
    elif mode == "corrupt":
        i = data.draw(st.integers(0, len(text)))
        text = text[:i] + data.draw(st.sampled_from(list("}]{[\":,x \\"))) + text[i:]
    elif mode == "splice":
        other, _ = data.draw(well_formed(fmt))
        text = text[:data.draw(st.integers(0, len(text)))] + data.draw(plain) + other
    else:
        text = data.draw(plain)
    _check(fmt, text, data.draw(splits(text)))


EXAMPLES = {
    "hermes": 'Hi <tool_c <tool_call>\n{"name": "f", "arguments": {"a": "</tool_call>"}}\n'
              '</tool_call>\n<tool_call>{"name": "g", "arguments": {"x": }}</tool_call>',
    "mistral": 'ok [TOOL_CALLS][{"name": "f", "arguments": {"a": [1, 2]}}] then'
               ' [TOOL_CALLS]g[ARGS]{"b": "[ARGS]"}',
    "llama3_json": ' <|python_tag|>{"name": "f", "parameters": {"a": 1}}; '
                   '{"name": "g", "parameters": {}}\nnot a call',
    "generic": '\n{"tool_calls": [{"name": "f", "arguments": {"a": {"b": null}}}, '
               '{"arguments": {}, "name": "g"}]} ',
}


def test_every_split_point() -> None:
    """Two pieces, cut at every point, and one character at a time."""
    for fmt, text in EXAMPLES.items():
        whole = PARSERS[fmt]().parse(text)
        assert whole.tool_calls, fmt
        for i in range(len(text) + 1):
            _check(fmt, text, [text[:i], text[i:]])
        _check(fmt, text, list(text))


def test_start_as_soon_as_the_name_is_known() -> None:
    stream = PARSERS["hermes"]().stream()
    assert stream.feed("Hello <tool_") == [ContentDelta("Hello ")]  # "<tool_" is held
    assert stream.feed('call>\n{"name": "get_weather", "argu') == []
    start, args = stream.feed('ments": {"ci')
    assert isinstance(start, ToolCallStart) and start.name == "get_weather"
    assert re.fullmatch(r"call_[0-9a-f]{24}", start.id)
    assert args == ArgumentsDelta(0, '{"ci')
    assert [e.text for e in stream.feed('ty": "Paris"}}')] == ['ty": "Paris"}']
    assert stream.feed("\n</tool_call>") == []
    assert stream.finish() == []


def test_text_flushed_as_soon_as_it_cannot_be_markup() -> None:
    hermes = PARSERS["hermes"]().stream()
    assert hermes.feed("a <tool") == [ContentDelta("a ")]
    assert hermes.feed("s") == [ContentDelta("<tools")]
    generic = PARSERS["generic"]().stream()
    assert generic.feed('{"ans') == []  # could still be {"tool_calls"...
    assert generic.feed('wer": 1}') == [ContentDelta('{"answer": 1}')]
    mistral = PARSERS["mistral"]().stream()
    assert mistral.feed("x [TOOL_C") == [ContentDelta("x ")]
    assert mistral.finish() == [ContentDelta("[TOOL_C")]
    llama = PARSERS["llama3_json"]().stream()
    assert llama.feed("Sure") == [ContentDelta("Sure")]


def test_whitespace_around_calls_is_not_content() -> None:
    stream = PARSERS["hermes"]().stream()
    events = stream.feed("\n\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n")
    events += stream.finish()
    assert not [e for e in events if isinstance(e, ContentDelta)]
    assert stream.result().content is None
