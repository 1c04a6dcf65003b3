"""``hermes-async doctor FILE.jsonl``: the prompt doctor's command line and plain-text report.

Wire it with::

    add_doctor_parser(subparsers)   # sets func=cmd_doctor
    args = parser.parse_args(); sys.exit(args.func(args))

Exit codes: 0 after a report (findings do not fail it), 2 on unreadable input (file, a malformed
line with its number, model directory, config).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

ADVICE = {
    "low_reuse": "multi-turn applications typically reuse 60-80% of the input (seed 3.1); look "
                 "for dynamic fields below, system prompts that differ per request, or messages "
                 "inserted/reordered before the end (an inserted turn shifts everything after "
                 "it, seed 3.3)",
    "dynamic_field": "move dynamic fields (date, timestamp, user or request id) out of the system "
                     "prompt and inject them later, e.g. in the last user message (seed 5.1: a "
                     "hit rate stuck at 0 points to a dynamic field)",
    "short_prompts": "a prompt of at most one block can never hit: reuse is per whole block and "
                     "the last token is always computed (seed 4.2)",
    "tool_as_user": "tool results must be rendered under the template's tool role, never as "
                    "user turns: the model then confuses tool output with new user input (seed "
                    "2.1, 5.2); fix the template or the role mapping",
    "tool_tags": "the rendered prompt has a different number of tool tags than tool messages "
                 "(seed 5.2: print the final prompt with `hermes-async render` and count them)",
    "tool_calls": "assistant tool calls and tool results do not pair up: every call needs its "
                  "result message (seed 5.2)",
    "unknown_roles": "unknown roles are mapped to user (seed 2.1); a tool result sent under an "
                     "unknown role is rendered as a user turn: use role 'tool'",
}
LOW_REUSE_SHARE = 0.5


def add_doctor_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``doctor`` sub-command to an ``argparse`` subparsers object; returns its parser.

    The parser sets ``func=cmd_doctor``.
    """
    p = subparsers.add_parser(
        "doctor", help="diagnose prefix-cache reuse of captured requests (JSONL)",
        description="Offline report on captured requests: shared prefixes and what a block "
                    "cache would serve, dynamic fields that fork the prefix tree, prompts too "
                    "short to hit, and tool-role rendering, with the seed's advice.")
    p.add_argument("file", help="JSONL: one chat request body ('messages', optional 'tools') "
                                "or raw 'prompt' per line")
    p.add_argument("--model", help="local Hugging Face model or tokenizer directory "
                                   "(default: the config's, else the embedded default model)")
    p.add_argument("--config", help="TOML config file: model path and cache.block_size")
    p.add_argument("--block-size", type=int, help="tokens per KV block (default: the config's, "
                                                  "else derived from the model's shape)")
    p.add_argument("--template", help="seed-form PromptTemplate TOML file to use instead of the "
                                      "model's own chat template")
    p.add_argument("--namespace-key", help="group lines into cache namespaces by this field "
                                           "(e.g. 'user')")
    p.add_argument("--top", type=int, default=10, help="divergence points to show (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=cmd_doctor)
    return p


def resolve_block_size(model_dir: Path, block_size: int | None,
                       configured: int | None) -> tuple[int, str]:
    """``(block size, where it came from)``: the flag, the config, else the model's shape."""
    if block_size is not None:
        if block_size < 1:
            raise ValueError("--block-size must be at least 1")
        return block_size, "--block-size"
    if configured is not None:
        return configured, "config"
    from hermes_async.model.kv_pool import derive_block_size

    cfg_path = model_dir / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        heads = cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot derive the block size from {cfg_path} ({e}); "
                         "give --block-size") from e
    return derive_block_size(kv_heads, head_dim), f"derived: {kv_heads} KV heads x {head_dim}"


def cmd_doctor(args: argparse.Namespace) -> int:
    """Run ``hermes-async doctor``; returns the exit code (0 report, 2 unreadable input)."""
    from transformers import AutoTokenizer

    from hermes_async import config as config_mod
    from hermes_async.model.default_model import resolve_model_path
    from hermes_async.observe.doctor import DoctorInputError, PromptReader, diagnose
    from hermes_async.prompt import TemplateConfigError, load_prompt_template

    try:
        cfg = config_mod.load(args.config) if args.config else None
        model = args.model or (cfg.model.path if cfg else None)
        model_dir = resolve_model_path(model)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        block_size, source = resolve_block_size(
            model_dir, args.block_size, cfg.cache.block_size if cfg else None)
        template = load_prompt_template(args.template) if args.template else None
        reader = PromptReader(tokenizer, template)
        prompts = reader.read(args.file, args.namespace_key)
    except DoctorInputError as e:
        print(f"hermes-async doctor: error: {args.file}: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError, RuntimeError, TemplateConfigError) as e:
        print(f"hermes-async doctor: error: {e}", file=sys.stderr)
        return 2
    report = diagnose(prompts, block_size=block_size, decode=tokenizer.decode,
                      top=max(args.top, 0), unknown_roles=reader.unknown_roles())
    doc = {"file": str(args.file), "model": str(model_dir), "block_size_source": source,
           **report.to_dict(), "findings": findings(report.to_dict())}
    if args.json:
        json.dump(doc, sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    else:
        write_text(doc, sys.stdout)
    return 0


def findings(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's problems, each ``{"kind", "message", "advice"}``, worst first."""
    out = []
    for p in d["divergence"]:
        out.append({"kind": "dynamic_field", "advice": ADVICE["dynamic_field"],
                    "message": f"prompts fork at token {p['position']} (namespace "
                               f"{p['namespace']!r}) and line up again after it: "
                               f"{p['requests']} requests, {p['tokens_lost']} tokens lost"})
    if d["prompts"] > 1 and d["reusable_share"] < LOW_REUSE_SHARE:
        out.append({"kind": "low_reuse", "advice": ADVICE["low_reuse"],
                    "message": f"a block cache would serve only {d['reusable_share']:.1%} of the "
                               f"prompt tokens"})
    for r in d["roles"]["problems"]:
        out.append({"kind": r["problem"], "advice": ADVICE[r["problem"]],
                    "message": f"line {r['line']}: {_role_line(r)}"})
    if d["roles"]["unknown_roles"]:
        out.append({"kind": "unknown_roles", "advice": ADVICE["unknown_roles"],
                    "message": f"unknown roles mapped to user: {d['roles']['unknown_roles']}"})
    if d["short_prompts"]["count"]:
        out.append({"kind": "short_prompts", "advice": ADVICE["short_prompts"],
                    "message": f"{_n(d['short_prompts']['count'], 'prompt')} of at most "
                               f"{d['block_size']} tokens"})
    return out


def _role_line(r: dict[str, Any]) -> str:
    what = {"tool_as_user": "tool output rendered as user turns",
            "tool_tags": "tool tags differ from tool messages",
            "tool_calls": "tool calls differ from tool results"}[r["problem"]]
    return (f"{what} (tool messages {r['tool_messages']}, tool tags {r['tool_tags']}, tool calls "
            f"{r['tool_calls']}, user messages {r['user_messages']}, user tags {r['user_tags']})")


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _show(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def write_text(d: dict[str, Any], out: TextIO) -> None:
    """The plain-text report of a ``doctor`` document (sections, advice under each finding)."""
    w = out.write
    w(f"hermes-async doctor: {d['file']}\n")
    w(f"model: {d['model']}; block size {d['block_size']} ({d['block_size_source']})\n")
    n, tokens = d["prompts"], d["tokens"]
    w("\n== Prompts ==\n")
    w(f"prompts: {n}, tokens: {tokens:,}" + (f" (mean {tokens / n:,.0f})" if n else "") + "\n")

    w("\n== Prefix reuse (seed 3) ==\n")
    sp, sv = d["shared_prefix_tokens"], d["served_tokens_per_prompt"]
    w(f"shared prefix with an earlier prompt (tokens): p50 {sp['p50']}, p90 {sp['p90']}, "
      f"max {sp['max']}\n")
    w(f"served by a block cache ({d['block_size']}-token blocks, no eviction): p50 {sv['p50']}, "
      f"p90 {sv['p90']}, max {sv['max']}\n")
    w(f"reusable share: {d['reusable_share']:.1%} ({d['served_tokens']:,} of {tokens:,} "
      f"tokens)\n")
    if n > 1 and d["reusable_share"] < LOW_REUSE_SHARE:
        w(f"  advice: {ADVICE['low_reuse']}\n")
    if len(d["namespaces"]) > 1:
        for ns, s in d["namespaces"].items():
            w(f"  namespace {ns!r}: {s['prompts']} prompts, {s['tokens']:,} tokens, "
              f"reusable {s['reusable_share']:.1%}, short {s['short_prompts']}\n")

    w("\n== Dynamic fields (seed 5.1) ==\n")
    if not d["divergence"]:
        w("none: no prompt forks the prefix tree and lines up again after a short span\n")
    for i, p in enumerate(d["divergence"], 1):
        w(f"{i}. token {p['position']} (block {p['block']}), namespace {p['namespace']!r}: "
          f"{p['requests']} requests, {p['tokens_lost']:,} prefill tokens lost "
          f"({p['share_of_prefill']:.0%} of prefill), span {_n(p['span_tokens'], 'token')}\n")
        before, after = _show(p["text_before"]), _show(p["text_after"])
        w(f"   this:  ...{before}[{_show(p['text_this'])}]{after}...\n")
        w(f"   other: ...{before}[{_show(p['text_other'])}]{after}...\n")
    if d["divergence"]:
        w(f"  advice: {ADVICE['dynamic_field']}\n")

    w("\n== Short prompts ==\n")
    short = d["short_prompts"]
    if short["count"]:
        lines = ", ".join(map(str, short["lines"][:10])) + (", ..." if short["count"] > 10 else "")
        w(f"{_n(short['count'], 'prompt')} of at most {d['block_size']} tokens "
          f"({'line' if short['count'] == 1 else 'lines'} {lines})\n")
        w(f"  advice: {ADVICE['short_prompts']}\n")
    else:
        w(f"none of at most {d['block_size']} tokens\n")

    w("\n== Tool roles (seed 2.1, 5.2) ==\n")
    r = d["roles"]
    w(f"chat prompts: {r['chat_prompts']}, with tools: {r['prompts_with_tools']}; tool messages "
      f"{r['tool_messages']}, tool calls {r['tool_calls']}, tool tags {r['tool_tags']}: "
      f"{'OK' if not r['problems'] else 'MISMATCH'}\n")
    for prob in r["problems"][:20]:
        w(f"line {prob['line']}: {_role_line(prob)}\n")
    for kind in dict.fromkeys(prob["problem"] for prob in r["problems"]):
        w(f"  advice: {ADVICE[kind]}\n")
    if r["unknown_roles"]:
        w(f"unknown roles mapped to user: {r['unknown_roles']}\n")
        w(f"  advice: {ADVICE['unknown_roles']}\n")
