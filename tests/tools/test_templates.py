"""Round trips through chat templates, with transformers' ``apply_chat_template`` as the oracle:
small templates in the style of the published Qwen 2.5, Llama 3.1 and Mistral ones (only their
tool parts) render an assistant message's ``tool_calls``; the assistant turn's text, cut out,
parses back to the same names and arguments. Also ``parser_for`` on those templates."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_async.tools import parser_for, template_supports_tools

QWEN_STYLE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\nReturn each call within <tool_call></tool_call> tags:\\n<tool_call>\\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls | default([]) %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}"
    "{{- '\", \"arguments\": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
)

LLAMA_STYLE = (
    "{{- '<|begin_of_text|>' }}"
    "{%- if tools is not none %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n"
    "Respond with {\"name\": function name, \"parameters\": dictionary of argument name and "
    "its value}.\\n' }}{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n' }}{%- endfor %}"
    "{{- '<|eot_id|>' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls is defined %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- for tool_call in message.tool_calls %}{%- set tool_call = tool_call.function %}"
    "{%- if not loop.first %}{{- '; ' }}{%- endif %}"
    "{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}' }}{%- endfor %}{{- '<|eot_id|>' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- else %}{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n'"
    " + message.content + '<|eot_id|>' }}{%- endif %}{%- endfor %}"
)

MISTRAL_STYLE = (
    "{{- '<s>' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{%- if tools is not none and loop.last %}{{- '[AVAILABLE_TOOLS] ' + (tools | tojson)"
    " + '[/AVAILABLE_TOOLS]' }}{%- endif %}{{- '[INST] ' + message.content + '[/INST]' }}"
    "{%- elif message.tool_calls is defined and message.tool_calls is not none %}"
    "{{- '[TOOL_CALLS] [' }}{%- for tool_call in message.tool_calls %}"
    "{{- '{\"name\": \"' + tool_call.function.name + '\", \"arguments\": ' }}"
    "{{- tool_call.function.arguments | tojson }}{{- ', \"id\": \"' + tool_call.id + '\"}' }}"
    "{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}{{- ']</s>' }}"
    "{%- elif message.role == 'assistant' %}{{- ' ' + message.content + '</s>' }}"
    "{%- endif %}{%- endfor %}"
)

PLAIN_CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
                "{{ '<|im_start|>assistant\\n' }}{% endif %}")

# (template, parser, text before the assistant turn's output, text after it)
CASES = {
    "qwen": (QWEN_STYLE, "hermes", "<|im_start|>assistant", "<|im_end|>"),
    "llama": (LLAMA_STYLE, "llama3_json", "<|start_header_id|>assistant<|end_header_id|>\n\n",
              "<|eot_id|>"),
    "mistral": (MISTRAL_STYLE, "mistral", "[/INST]", "</s>"),
}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def render_turn(tok: Any, template: str, before: str, after: str,
                calls: list[tuple[str, dict[str, Any]]], content: str | None = None) -> str:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": content, "tool_calls": [
            {"id": f"abcdefgh{i}", "type": "function",
             "function": {"name": name, "arguments": args}}
            for i, (name, args) in enumerate(calls)]},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, chat_template=template,
                                   tokenize=False)
    start = text.rindex(before) + len(before)
    return text[start:text.index(after, start)]


def check_round_trip(tok: Any, case: str, calls: list[tuple[str, dict[str, Any]]],
                     content: str | None = None) -> None:
    template, fmt, before, after = CASES[case]
    turn = render_turn(tok, template, before, after, calls, content)
    parser = parser_for(template)
    assert parser.name == fmt
    parsed = parser.parse(turn)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == calls, turn
    assert (parsed.content or "").strip() == (content or "")
    stream = parser.stream()
    events = [e for piece in turn for e in stream.feed(piece)] + stream.finish()
    assert [e.name for e in events if hasattr(e, "name")] == [n for n, _ in calls]


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_single_and_parallel(hf_tokenizer: Any, case: str) -> None:
    check_round_trip(hf_tokenizer, case, [("get_weather", {"city": "Paris"})])
    check_round_trip(hf_tokenizer, case, [("get_weather", {"city": "Paris"}),
                                          ("get_time", {"tz": "Europe/Paris", "fmt": None}),
                                          ("noop", {})])


def test_round_trip_with_content(hf_tokenizer: Any) -> None:
    check_round_trip(hf_tokenizer, "qwen", [("get_weather", {"city": "Rome"})],
                     content="Let me check.")


json_args = st.dictionaries(
    st.text(max_size=6),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                 lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6),
    max_size=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=st.sampled_from(sorted(CASES)),
       calls=st.lists(st.tuples(st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True),
                                json_args), min_size=1, max_size=3))
def test_round_trip_random_arguments(hf_tokenizer: Any, case: str,
                                     calls: list[tuple[str, dict[str, Any]]]) -> None:
    check_round_trip(hf_tokenizer, case, calls)


def test_parser_for_detection(hf_tokenizer: Any) -> None:
    assert parser_for(QWEN_STYLE).name == "hermes"
    assert parser_for(LLAMA_STYLE).name == "llama3_json"
    assert parser_for(MISTRAL_STYLE).name == "mistral"
    assert parser_for(PLAIN_CHATML).name == "generic"
    assert parser_for(None).name == "generic"
    assert parser_for(hf_tokenizer.chat_template).name == (
        "generic" if not template_supports_tools(hf_tokenizer.chat_template) else "hermes")
    # Llama 3.1 builtin-tool style with the tag only
    assert parser_for("{% if tools %}<|python_tag|>{% endif %}").name == "llama3_json"
    # tool support, but no format the text points to
    assert parser_for("{% for t in tools %}{{ t | tojson }}{% endfor %}").name == "hermes"
    # the override wins; unknown names are refused with the choices
    assert parser_for(QWEN_STYLE, "mistral").name == "mistral"
    assert parser_for(None, "llama3_json").name == "llama3_json"
    with pytest.raises(ValueError, match="choices: generic, hermes, llama3_json, mistral"):
        parser_for(QWEN_STYLE, "qwen25")


def test_template_supports_tools() -> None:
    assert template_supports_tools(QWEN_STYLE)
    assert template_supports_tools(LLAMA_STYLE)
    assert template_supports_tools(MISTRAL_STYLE)
    assert not template_supports_tools(PLAIN_CHATML)
    assert not template_supports_tools(None)
    assert not template_supports_tools("")
    # only the Jinja code counts: not plain text, string literals or tool_calls
    assert not template_supports_tools("Use tools wisely {{ messages[0]['content'] }}")
    assert not template_supports_tools("{{ 'no tools here' }}{% for m in messages %}{% endfor %}")
    assert not template_supports_tools("{% for tc in message.tool_calls %}{% endfor %}")
    assert template_supports_tools("{%- if tools is defined and tools %}x{% endif %}")
