"""Templates: the seed-form PromptTemplate (TOML), the model's Jinja template, versions, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermes_async.prompt import (
    HFChatTemplate,
    PromptAssembler,
    PromptError,
    PromptTemplate,
    TemplateConfigError,
    TemplateRenderError,
    load_prompt_template,
)
from tests.prompt.conftest import build_llama_tokenizer
from tests.prompt.convgen import TOOLS

CHATML = Path(__file__).resolve().parents[2] / "configs" / "templates" / "chatml.toml"
TAGS = {r: f"<{r}>" for r in ("system", "user", "assistant", "tool")}

CONV = [
    {"role": "system", "content": "  Be brief. "},
    {"role": "user", "content": "weather?", "name": "zoe"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "function", "name": "get_weather", "content": "21C"},
]


def test_chatml_toml_renders_the_seed_form(smol_tokenizer: Any) -> None:
    tmpl = load_prompt_template(CHATML)
    assert tmpl.name == "chatml-seed" and tmpl.version.startswith("seed-")
    a = PromptAssembler(smol_tokenizer, tmpl)
    p = a.assemble(CONV, tools=TOOLS)
    assert p.text == (
        "<|im_start|>system\nYou can call these functions. Answer with <tool_call> lines:\n"
        + '{"type": "function", "function": {"name": "get_weather", "description": '
          '"Weather for a city <b>now</b>", "parameters": {"type": "object", "properties": '
          '{"city": {"type": "string"}}, "required": ["city"]}}}<|im_end|>\n'
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nname=zoe\nweather?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\nname=get_weather\n21C<|im_end|>\n"
        "<|im_start|>assistant\n")
    ids = list(p.token_ids)
    assert ids.count(1) == 6 and ids.count(2) == 5  # <|im_start|>, <|im_end|> from tags only
    assert p.role_counts == {"system": 1, "user": 1, "assistant": 1, "tool": 1}
    oracle = smol_tokenizer(p.text, add_special_tokens=False)["input_ids"]
    assert ids == oracle  # no control-token strings in user text: plain encoding


def test_prompt_template_options() -> None:
    t = PromptTemplate(name="x", role_tags=TAGS, bos="<s>", eos="</s>", message_suffix="",
                       name_format="[{name}] ", strip_content=False, generation_prompt="A:")
    msgs = [{"role": "user", "content": " hi ", "name": "n"}, {"role": "tool", "content": "r"}]
    assert t.render(msgs, tools=None, add_generation_prompt=True) == \
        "<s><user>[n]  hi </s><tool>r</s>A:"
    assert t.render(msgs, tools=None, add_generation_prompt=False).endswith("<tool>r</s>")
    with pytest.raises(TemplateRenderError) as info:
        t.render(msgs, tools=TOOLS, add_generation_prompt=True)
    assert info.value.param == "tools"
    assert t.version != PromptTemplate(name="x", role_tags=TAGS).version
    assert PromptTemplate(name="x", role_tags=TAGS, explicit_version="7").version == "7"


@pytest.mark.parametrize(("data", "match"), [
    ({"name": "x", "role_tags": TAGS, "colour": "red"}, "unknown key"),
    ({"role_tags": TAGS}, "name"),
    ({"name": "x"}, "role_tags"),
    ({"name": "x", "role_tags": {k: v for k, v in TAGS.items() if k != "tool"}}, "tool"),
    ({"name": "x", "role_tags": {**TAGS, "robot": "<r>"}}, "robot"),
    ({"name": "x", "role_tags": TAGS, "version": ""}, "version"),
])
def test_prompt_template_config_errors(data: dict[str, Any], match: str) -> None:
    with pytest.raises(TemplateConfigError, match=match):
        PromptTemplate.from_dict(data)


def test_toml_file_errors(tmp_path: Path) -> None:
    with pytest.raises(TemplateConfigError, match="not found"):
        load_prompt_template(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[template\n")
    with pytest.raises(TemplateConfigError, match="TOML"):
        load_prompt_template(bad)
    other = tmp_path / "other.toml"
    other.write_text("[model]\npath = 'x'\n")
    with pytest.raises(TemplateConfigError, match="template"):
        load_prompt_template(other)


def test_hf_template_passes_tools_and_generation_prompt(llama_tokenizer: Any) -> None:
    a = PromptAssembler(llama_tokenizer)
    with_tools = a.assemble(CONV[:2], tools=TOOLS)
    assert '"name": "get_weather"' in with_tools.text and with_tools.text.count("Tools:") == 1
    no_gen = a.assemble(CONV[:2], add_generation_prompt=False)
    assert with_tools.text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert no_gen.text.endswith("weather?<|eot_id|>")
    assert [c.content for c in a.tokenizer.controls][-2:] == ["<tool_call>", "</tool_call>"]


def test_hf_version_covers_source_and_special_tokens() -> None:
    tok = build_llama_tokenizer()
    v0 = HFChatTemplate(tok).version
    assert v0 == HFChatTemplate(build_llama_tokenizer()).version  # deterministic
    assert HFChatTemplate(tok, version="pinned").version == "pinned"
    assert HFChatTemplate(tok, chat_template=tok.chat_template + " ").version != v0
    tok.add_special_tokens({"additional_special_tokens": ["<|python_tag|>"]})
    assert HFChatTemplate(tok).version != v0


def test_template_refusal_is_a_400(smol_tokenizer: Any) -> None:
    src = ("{% for m in messages %}{% if m['role'] == 'system' %}"
           "{{ raise_exception('System role not supported') }}{% endif %}"
           "{{ m['content'] }}{% endfor %}")
    a = PromptAssembler(smol_tokenizer, HFChatTemplate(smol_tokenizer, chat_template=src))
    with pytest.raises(TemplateRenderError, match="System role not supported") as info:
        a.assemble(CONV[:1])
    assert isinstance(info.value, PromptError) and info.value.param == "messages"
    assert a.assemble(CONV[1:2]).text == "weather?"


def test_tokenizer_without_template() -> None:
    tok = build_llama_tokenizer()
    tok.chat_template = None
    with pytest.raises(TemplateConfigError):
        PromptAssembler(tok)
    seed = PromptAssembler(tok, PromptTemplate(name="s", role_tags=TAGS, eos="<|eot_id|>"))
    assert seed.assemble(CONV[1:2]).text == "<user>name=zoe\nweather?<|eot_id|>\n<assistant>"


@pytest.mark.parametrize("tools", ["x", [1], {"a": 1}, [{"f": object()}]])
def test_bad_tools_are_a_400(smol_tokenizer: Any, tools: Any) -> None:
    with pytest.raises(PromptError) as info:
        PromptAssembler(smol_tokenizer).assemble(CONV[:2], tools=tools)
    assert info.value.param == "tools"
