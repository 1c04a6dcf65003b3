"""Oracle: hermes ids == ``tokenizer.apply_chat_template(..., tokenize=True)`` on generated chats.

For each tokenizer (the default model's, and the tiny Llama-3 and Mistral style ones), at least
200 random conversations without control-token strings in user text must give exactly the
oracle's ids and text: on the normal path, on the forced run-by-run protected path, and through
incremental multi-turn assembly (every turn assembled in order with a cache equals a full
assembly).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from hermes_async.prompt import AssemblyCache, PromptAssembler, RoleNormalizer, parse_messages
from tests.prompt.convgen import TOOLS, random_conversation
from tests.prompt.family_templates import TOOL_TEMPLATES

N_CONVERSATIONS = 200


def _user_strings(msgs: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in msgs:
        c = m.get("content")
        out += [c] if isinstance(c, str) else [p["text"] for p in c or []]
        out += [m[k] for k in ("name", "tool_call_id") if k in m]
        for tc in m.get("tool_calls", []):
            out += [tc["function"]["name"], tc["function"]["arguments"]]
    return out


def _has_control(msgs: list[dict[str, Any]], controls: list[str]) -> bool:
    return any(c in s for s in _user_strings(msgs) for c in controls)


def _oracle(tok: Any, msgs: list[dict[str, Any]], tools: Any, gen: bool) -> tuple[list[int], str]:
    dicts = [m.to_template_dict() for m in parse_messages(msgs, RoleNormalizer()).messages]
    ids = tok.apply_chat_template(dicts, tools=tools, add_generation_prompt=gen, tokenize=True,
                                  return_dict=False)
    text = tok.apply_chat_template(dicts, tools=tools, add_generation_prompt=gen, tokenize=False)
    return ids, text


@pytest.mark.parametrize("name", ["smol", "llama", "mistral", "gemma", "phi", "granite",
                                  "hermes"])
def test_ids_equal_apply_chat_template(name: str, request: pytest.FixtureRequest) -> None:
    tok = request.getfixturevalue(f"{name}_tokenizer")
    plain = PromptAssembler(tok)
    cached = PromptAssembler(tok, cache=AssemblyCache(max_entries=64))
    controls = [c.content for c in plain.tokenizer.controls]
    rng = random.Random(1234 + len(name))
    checked = partial_hits = protected_runs = 0
    while checked < N_CONVERSATIONS:
        msgs = random_conversation(rng, tools=name in TOOL_TEMPLATES)
        if _has_control(msgs, controls):
            continue
        gen = rng.random() < 0.8
        tools = TOOLS if name in TOOL_TEMPLATES and rng.random() < 0.3 else None
        want_ids, want_text = _oracle(tok, msgs, tools, gen)

        got = plain.assemble(msgs, tools=tools, add_generation_prompt=gen)
        assert got.text == want_text
        assert list(got.token_ids) == want_ids, (name, msgs)

        conv = parse_messages(msgs, RoleNormalizer())
        marked, _ = plain.render_marked(conv, tools, gen)
        protected_runs += marked != want_text  # edge fragments were marked
        forced = plain.tokenizer.encode(marked, force_protected=True)
        assert forced.ids == want_ids, (name, msgs)
        assert forced.text == want_text

        # Turn by turn: every prefix that ends in a user/tool message, in order.
        ends = [i + 1 for i, m in enumerate(msgs) if m["role"] in ("user", "human", "tool")]
        for end in ends:
            prefix = msgs[:end]
            inc = cached.assemble(prefix, tools=tools, add_generation_prompt=gen)
            full = plain.assemble(prefix, tools=tools, add_generation_prompt=gen)
            assert inc.token_ids == full.token_ids, (name, prefix)
            partial_hits += inc.cache_outcome == "partial"
        checked += 1
    assert partial_hits > N_CONVERSATIONS  # incremental reuse really happened
    assert protected_runs > 0  # some edge fragments took the marked path


NO_BOS = ("{% for m in messages %}{% if m['role'] == 'assistant' %}"
          "{{ ' ' + m['content'] + eos_token }}{% else %}{{ m['content'] + ' [/INST]' }}"
          "{% endif %}{% endfor %}")


@pytest.mark.parametrize("name", ["smol", "mistral"])
def test_text_before_the_first_control_token(name: str, request: pytest.FixtureRequest) -> None:
    """Run 0 starts at offset 0 (Metaspace adds its prefix there only): still exact."""
    from hermes_async.prompt import HFChatTemplate

    tok = request.getfixturevalue(f"{name}_tokenizer")
    a = PromptAssembler(tok, HFChatTemplate(tok, chat_template=NO_BOS), AssemblyCache())
    controls = [c.content for c in a.tokenizer.controls]
    rng = random.Random(99)
    checked = 0
    while checked < 60:
        msgs = random_conversation(rng)
        if _has_control(msgs, controls):
            continue
        dicts = [m.to_template_dict() for m in parse_messages(msgs, RoleNormalizer()).messages]
        want = tok.apply_chat_template(dicts, chat_template=NO_BOS, tokenize=True,
                                       return_dict=False)
        conv = parse_messages(msgs, RoleNormalizer())
        marked, _ = a.render_marked(conv, None, False)
        assert a.tokenizer.encode(marked, force_protected=True).ids == want
        assert list(a.assemble(msgs, add_generation_prompt=False).token_ids) == want
        checked += 1


def test_family_templates_pick_their_tool_parser() -> None:
    """Hermes / Qwen3's ChatML template reads tool calls as hermes; templates without tools
    get the generic parser (and its tools prompt)."""
    from hermes_async.tools import parser_for, template_supports_tools
    from tests.prompt import family_templates as ft

    assert parser_for(ft.HERMES_TEMPLATE).name == "hermes"
    assert template_supports_tools(ft.GRANITE_TEMPLATE)
    for template in (ft.GEMMA_TEMPLATE, ft.PHI_TEMPLATE):
        assert parser_for(template).name == "generic"
