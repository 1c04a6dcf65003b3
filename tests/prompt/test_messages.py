"""Message model and role normalization: accepted shapes, every malformed shape, roles table."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from hermes_async.prompt import (
    MessageValidationError,
    PromptError,
    RoleNormalizer,
    UnknownRoleError,
    parse_messages,
)
from hermes_async.prompt.roles import ROLE_TABLE

U = {"role": "user", "content": "hi"}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _a(**kw: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, **kw}


MALFORMED: list[tuple[Any, str]] = [
    ("hello", "messages"),
    ({"role": "user"}, "messages"),
    ([], "messages"),
    ([U, 5], "messages[1]"),
    ([U, U, {"content": "x"}], "messages[2].role"),
    ([{"role": None, "content": "x"}], "messages[0].role"),
    ([{"role": "  ", "content": "x"}], "messages[0].role"),
    ([{"role": 3, "content": "x"}], "messages[0].role"),
    ([{"role": ["user"], "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": {"text": "x"}}], "messages[0].content"),
    ([{"role": "user", "content": True}], "messages[0].content"),
    ([{"role": "user", "content": []}], "messages[0].content"),
    ([{"role": "user", "content": ["x"]}], "messages[0].content[0]"),
    ([{"role": "user", "content": [{"type": "text", "text": "a"}, 7]}], "messages[0].content[1]"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[0].content[0].type"),
    ([{"role": "user", "content": [{"text": "x"}]}], "messages[0].content[0].type"),
    ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text"),
    ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "messages[0].content[0].text"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "system"}], "messages[0].content"),
    ([U, _a()], "messages[1].content"),
    ([U, _a(tool_calls=[])], "messages[1].content"),
    ([{"role": "user", "content": "x", "name": 5}], "messages[0].name"),
    ([U, _a(tool_calls="f")], "messages[1].tool_calls"),
    ([U, _a(tool_calls=[5])], "messages[1].tool_calls[0]"),
    ([U, _a(tool_calls=[CALL, {**CALL, "type": "retrieval"}])], "messages[1].tool_calls[1].type"),
    ([U, _a(tool_calls=[{"id": "c", "function": "f"}])], "messages[1].tool_calls[0].function"),
    ([U, _a(tool_calls=[{"id": "c", "function": {"arguments": "{}"}}])],
     "messages[1].tool_calls[0].function.name"),
    ([U, _a(tool_calls=[{"id": "c", "function": {"name": "", "arguments": "{}"}}])],
     "messages[1].tool_calls[0].function.name"),
    ([U, _a(tool_calls=[{"id": "c", "function": {"name": "f", "arguments": 5}}])],
     "messages[1].tool_calls[0].function.arguments"),
    ([U, _a(tool_calls=[{**CALL, "id": 5}])], "messages[1].tool_calls[0].id"),
    ([U, _a(function_call={"name": 3})], "messages[1].function_call.name"),
    ([U, _a(function_call="f")], "messages[1].function_call"),
    ([U, {"role": "tool", "content": "21", "tool_call_id": 5}], "messages[1].tool_call_id"),
    ([{"role": "user", "content": "bad \ud800 surrogate"}], "messages[0].content"),
]


@pytest.mark.parametrize(("messages", "param"), MALFORMED)
def test_malformed_messages_raise_typed_error(messages: Any, param: str) -> None:
    with pytest.raises(MessageValidationError) as info:
        parse_messages(messages, RoleNormalizer())
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, PromptError)
    assert err.param == param
    body = err.to_openai_error()["error"]
    assert body["param"] == param and body["type"] == "invalid_request_error" and body["message"]


def test_accepted_shapes() -> None:
    conv = parse_messages([
        {"role": "System_Prompt", "content": "sys"},
        {"role": "human", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
         "name": "zoe"},
        {"role": "bot", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "21", "tool_call_id": "c1"},
        {"role": "assistant", "content": "", "function_call": {"name": "g", "arguments": "{}"}},
        {"role": "function", "name": "g", "content": "ok"},
        {"role": "prompter", "content": "x", "extra_key": "ignored"},
    ], RoleNormalizer())
    m = conv.messages
    assert [x.role for x in m] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                   "user"]
    assert m[1].content == "a\nb" and m[1].name == "zoe"
    assert m[2].content == "" and m[2].tool_calls[0].name == "f" and m[2].tool_calls[0].id == "c1"
    assert m[3].tool_call_id == "c1"
    assert m[4].tool_calls[0].name == "g"
    assert m[5].name == "g" and m[5].tool_call_id is None
    assert conv.role_codes == "suatatu"
    assert conv.role_counts() == {"system": 1, "user": 2, "assistant": 2, "tool": 2}
    d = m[2].to_template_dict()
    assert d["tool_calls"][0]["function"]["arguments"] == {}  # JSON object strings parsed
    assert m[0].raw_role == "System_Prompt"


def test_digests_cover_every_field_and_prefixes() -> None:
    base = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    d = parse_messages(base, RoleNormalizer())
    variants = [
        [{"role": "user", "content": "hi "}, base[1]],
        [{"role": "system", "content": "hi"}, base[1]],
        [{"role": "user", "content": "hi", "name": "x"}, base[1]],
        [base[0], {"role": "assistant", "content": "yo", "tool_calls": [CALL]}],
        [{"role": "user", "content": "hiy"}, {"role": "assistant", "content": "o"}],
    ]
    digests = {parse_messages(v, RoleNormalizer()).prefix_digest(2) for v in variants}
    assert len(digests | {d.prefix_digest(2)}) == len(variants) + 1
    longer = parse_messages([*base, {"role": "user", "content": "more"}], RoleNormalizer())
    assert longer.prefix_digest(2) == d.prefix_digest(2)
    assert longer.prefix_digest(1) == d.prefix_digest(1) != d.prefix_digest(2)
    assert len(d.prefix_digest(2)) == 16


def test_role_table_is_the_seeds() -> None:
    norm = RoleNormalizer()
    expected = {"system": "system", "system_prompt": "system", "human": "user",
                "prompter": "user", "bot": "assistant", "assistant": "assistant",
                "tool": "tool", "function": "tool", "user": "user"}
    assert dict(ROLE_TABLE) == expected
    for raw, role in expected.items():
        assert norm.normalize(raw) == role
        assert norm.normalize(f"  {raw.upper()} ") == role
    assert norm.unknown_role_counts() == {}


def test_unknown_roles_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    norm = RoleNormalizer()
    msgs = [{"role": "robot", "content": "a"}, {"role": "Robot", "content": "b"},
            {"role": "narrator", "content": "c"}]
    with caplog.at_level(logging.WARNING, logger="hermes_async.prompt.roles"):
        conv = parse_messages(msgs, norm)
        parse_messages(msgs[:1], norm)
    assert [m.role for m in conv.messages] == ["user"] * 3
    assert norm.unknown_role_counts() == {"robot": 3, "narrator": 1}
    assert norm.unknown_roles_total == 4
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and any("robot" in x for x in logged)
    assert RoleNormalizer().unknown_role_counts() == {}  # counters live on the object


def test_strict_roles_raise() -> None:
    norm = RoleNormalizer(strict=True)
    with pytest.raises(UnknownRoleError) as info:
        parse_messages([U, {"role": "robot", "content": "x"}], norm)
    assert info.value.param == "messages[1].role" and info.value.code == "unknown_role"
    assert parse_messages([{"role": "bot", "content": "x"}], norm).messages[0].role == "assistant"
