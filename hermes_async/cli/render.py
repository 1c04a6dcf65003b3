"""``hermes-async render``: print the final prompt of a messages file, the tool-role check.

Control tokens that the template emitted are shown as ``⟦<|im_start|>⟧`` (a control-token string
typed by a user stays plain text), followed by the token count, messages per role, a count per
role tag (control token + role word, e.g. ``<|im_start|>tool``), and the tool check: tool-role
tags vs tool messages vs tool calls (a tool result rendered under another role shows up as a
tool message without a tool tag).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``render`` to the top-level subparsers; it sets ``func=run``."""
    p = subparsers.add_parser(
        "render", help="print the final prompt of a messages JSON file",
        description="Assemble a chat request's prompt exactly as the server would and print it "
                    "with control tokens marked, the token count and a count per role tag.")
    p.add_argument("messages", help="JSON file: a list of messages, or a chat request body with "
                                    "'messages' (and optional 'tools'); '-' reads stdin")
    p.add_argument("--model", help="local Hugging Face model or tokenizer directory "
                                   "(default: the embedded default model)")
    p.add_argument("--template", help="PromptTemplate TOML file (configs/templates/) to use "
                                      "instead of the model's own chat template")
    p.add_argument("--tools", help="JSON file with a list of tools (overrides the request's)")
    p.add_argument("--no-generation-prompt", action="store_true",
                   help="do not append the assistant generation prompt")
    p.add_argument("--strict-roles", action="store_true", help="unknown roles are an error")
    p.add_argument("--allow-special-tokens-in-content", action="store_true",
                   help="let control-token strings in user text become control tokens")
    p.add_argument("--ids", action="store_true", help="also print the token ids")
    p.add_argument("--raw", action="store_true", help="print the prompt text without markers")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when tool tags, tool messages and tool calls disagree")
    p.set_defaults(func=run)


def _load_tokenizer(model: str | None) -> Any:
    """The tokenizer of ``model`` (a directory), or of the embedded default model."""
    from hermes_async.model.default_model import resolve_model_path
    from hermes_async.model.tokenizer import load_tokenizer

    return load_tokenizer(resolve_model_path(model))


def _read_json(path: str) -> Any:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    return json.loads(text)


def run(args: argparse.Namespace) -> int:
    """Run ``hermes-async render``; returns the process exit code (0 ok, 1 failed --check,
    2 invalid input)."""
    from hermes_async.prompt import (
        AssemblyOptions,
        PromptAssembler,
        PromptError,
        TemplateConfigError,
        is_tool_tag,
        load_prompt_template,
        role_tags,
    )

    try:
        data = _read_json(args.messages)
        tools = data.get("tools") if isinstance(data, dict) else None
        messages = data.get("messages") if isinstance(data, dict) else data
        if args.tools:
            tools = _read_json(args.tools)
        tokenizer = _load_tokenizer(args.model)
        template = load_prompt_template(args.template) if args.template else None
        options = AssemblyOptions(
            strict_roles=args.strict_roles,
            allow_special_tokens_in_content=args.allow_special_tokens_in_content)
        assembler = PromptAssembler(tokenizer, template, None, options)
        inspected = assembler.inspect(messages, tools=tools,
                                      add_generation_prompt=not args.no_generation_prompt)
    except PromptError as e:
        print(f"error: {e} (param: {e.param})", file=sys.stderr)
        return 2
    except (OSError, ValueError, RuntimeError, TemplateConfigError) as e:
        print(f"error: {e}", file=sys.stderr)  # bad file / JSON / template; model fetch failed
        return 2
    out = sys.stdout
    prompt = inspected.prompt
    name = assembler.template.name
    out.write(f"===== prompt: template {name!r}, version {prompt.template_version} =====\n")
    if args.raw:
        out.write(prompt.text)
    else:
        out.write("".join(f"⟦{t}⟧" if ctrl else t for t, ctrl in inspected.segments))
    out.write("\n===== summary =====\n")
    out.write(f"tokens: {prompt.num_tokens}\n")
    roles = ", ".join(f"{r} {n}" for r, n in prompt.role_counts.items())
    out.write(f"messages per role: {roles}\n")
    tags = role_tags(inspected)
    out.write("role tags (control token + role):\n")
    for tag, n in sorted(tags.items()):
        out.write(f"  {tag!r:<40} {n}\n")
    tool_tags = sum(n for tag, n in tags.items() if is_tool_tag(tag))
    tool_msgs = prompt.role_counts.get("tool", 0)
    tool_calls = sum(len(m.tool_calls) for m in inspected.messages)
    ok = tool_tags == tool_msgs and (tool_calls == tool_msgs or tool_calls == 0)
    verdict = "OK" if ok else "MISMATCH (tool results rendered under another role?)"
    out.write(f"tool tags: {tool_tags}, tool messages: {tool_msgs}, tool calls: {tool_calls}"
              f"  {verdict}\n")
    unknown = assembler.roles.unknown_role_counts()
    if unknown:
        out.write(f"unknown roles mapped to user: {unknown}\n")
    if args.ids:
        out.write(f"ids: {list(prompt.token_ids)}\n")
    return 1 if args.check and not ok else 0
