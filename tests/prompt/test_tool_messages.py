"""Lenient tool messages (as vLLM): a ``tool`` message without ``tool_call_id`` and a legacy
``function`` message are normalized to role ``tool``; strict roles refuse what OpenAI's schema
refuses (no ``tool_call_id`` on a tool message, no ``name`` on a function message)."""

from __future__ import annotations

from typing import Any

import pytest

from hermes_async.prompt import (
    AssemblyOptions,
    MessageValidationError,
    PromptAssembler,
    RoleNormalizer,
    parse_messages,
)

U = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
ASSISTANT_CALL = {"role": "assistant", "content": None, "tool_calls": [CALL]}
LEGACY_CALL = {"role": "assistant", "content": None,
               "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOL_NO_ID = {"role": "tool", "content": '{"temp": 21}'}
TOOL_NAME_NO_ID = {"role": "tool", "name": "get_weather", "content": '{"temp": 21}'}
FUNCTION = {"role": "function", "name": "get_weather", "content": '{"temp": 21}'}
FUNCTION_NO_NAME = {"role": "Function", "content": '{"temp": 21}'}


def test_tool_message_without_tool_call_id_is_accepted_when_lenient() -> None:
    conv = parse_messages([U, ASSISTANT_CALL, TOOL_NO_ID, TOOL_NAME_NO_ID], RoleNormalizer())
    tool, named = conv.messages[2], conv.messages[3]
    assert (tool.role, tool.content, tool.tool_call_id, tool.name) == (
        "tool", '{"temp": 21}', None, None)
    assert tool.to_template_dict() == {"role": "tool", "content": '{"temp": 21}'}
    assert named.to_template_dict() == {"role": "tool", "content": '{"temp": 21}',
                                        "name": "get_weather"}
    assert conv.role_codes == "uatt"


def test_legacy_function_message_becomes_a_tool_message_with_its_name() -> None:
    for norm in (RoleNormalizer(), RoleNormalizer(strict=True)):  # valid OpenAI (deprecated)
        conv = parse_messages([U, LEGACY_CALL, FUNCTION], norm)
        msg = conv.messages[2]
        assert (msg.role, msg.name, msg.tool_call_id, msg.raw_role) == (
            "tool", "get_weather", None, "function")
        assert msg.to_template_dict() == {"role": "tool", "content": '{"temp": 21}',
                                          "name": "get_weather"}
        assert conv.messages[1].tool_calls[0].name == "get_weather"


def test_function_message_without_name_is_accepted_when_lenient() -> None:
    msg = parse_messages([U, LEGACY_CALL, FUNCTION_NO_NAME], RoleNormalizer()).messages[2]
    assert (msg.role, msg.name, msg.tool_call_id) == ("tool", None, None)


@pytest.mark.parametrize(("message", "param", "text"), [
    (TOOL_NO_ID, "messages[2].tool_call_id", "tool_call_id"),
    (TOOL_NAME_NO_ID, "messages[2].tool_call_id", "tool_call_id"),
    (FUNCTION_NO_NAME, "messages[2].name", "name"),
])
def test_strict_roles_refuse_them(message: dict[str, Any], param: str, text: str) -> None:
    with pytest.raises(MessageValidationError) as info:
        parse_messages([U, ASSISTANT_CALL, message], RoleNormalizer(strict=True))
    assert info.value.param == param and text in str(info.value)
    assert info.value.to_openai_error()["error"]["type"] == "invalid_request_error"


def test_strict_roles_accept_the_openai_shapes() -> None:
    tool = {**TOOL_NO_ID, "tool_call_id": "c1"}
    conv = parse_messages([U, ASSISTANT_CALL, tool], RoleNormalizer(strict=True))
    assert conv.messages[2].tool_call_id == "c1"


def test_a_missing_id_is_its_own_cache_key() -> None:
    norm = RoleNormalizer()
    digests = {parse_messages([U, ASSISTANT_CALL, m], norm).prefix_digest(3)
               for m in (TOOL_NO_ID, {**TOOL_NO_ID, "tool_call_id": ""},
                         {**TOOL_NO_ID, "tool_call_id": "c1"}, TOOL_NAME_NO_ID)}
    assert len(digests) == 4


def test_assembler_renders_them_and_strict_assembler_refuses(llama_tokenizer: Any) -> None:
    lenient = PromptAssembler(llama_tokenizer)
    text = lenient.assemble([U, ASSISTANT_CALL, TOOL_NO_ID]).text
    assert '<|start_header_id|>tool<|end_header_id|>\n\n{"temp": 21}<|eot_id|>' in text
    legacy = lenient.assemble([U, LEGACY_CALL, FUNCTION]).text
    assert ('<|start_header_id|>tool<|end_header_id|>\n\nname: get_weather\n{"temp": 21}'
            in legacy)
    strict = PromptAssembler(llama_tokenizer, options=AssemblyOptions(strict_roles=True))
    with pytest.raises(MessageValidationError):
        strict.assemble([U, ASSISTANT_CALL, TOOL_NO_ID])
    assert strict.assemble([U, LEGACY_CALL, FUNCTION]).text == legacy
