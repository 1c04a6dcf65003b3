"""``POST /v1/chat/completions`` with lenient tool messages (as vLLM accepts them): a ``tool``
message without ``tool_call_id`` and a legacy ``function`` message answer 200 on the real
default model; a malformed ``tool_call_id`` is still a 400 naming the field."""

from __future__ import annotations

import pytest

from tests.server.helpers import request_json

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.mark.parametrize("messages", [
    [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
     {"role": "tool", "content": '{"temp": 21}'}],
    [USER, {"role": "assistant", "content": None,
            "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
     {"role": "function", "name": "get_weather", "content": '{"temp": 21}'}],
], ids=["tool-without-tool_call_id", "legacy-function"])
def test_lenient_tool_messages_are_answered(server, messages):
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
    status, _, res = request_json(f"{server.base_url}/chat/completions", body)
    assert status == 200, res
    assert res["usage"]["completion_tokens"] >= 1


def test_a_malformed_tool_call_id_is_still_refused(server):
    messages = [USER, {"role": "tool", "content": "21", "tool_call_id": 5}]
    status, _, res = request_json(f"{server.base_url}/chat/completions",
                                  {"model": MODEL, "messages": messages, "max_tokens": 4})
    assert status == 400 and res["error"]["param"] == "messages[1].tool_call_id"
