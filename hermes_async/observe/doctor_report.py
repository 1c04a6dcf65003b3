"""The prompt doctor's report: :class:`DoctorReport` and its ``--json`` document, the findings
worst first with advice, and the plain-text report of ``hermes-async doctor``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from hermes_async.observe.doctor_roles import RoleTotals
from hermes_async.observe.doctor_simulator import ReuseFigures

ADVICE = {
    "low_reuse": "multi-turn applications typically reuse 60-80% of the input; look for dynamic "
                 "fields below, system prompts that differ per request, or messages "
                 "inserted/reordered before the end (an inserted turn shifts everything after "
                 "it)",
    "dynamic_field": "move dynamic fields (date, timestamp, user or request id) out of the system "
                     "prompt and inject them later, e.g. in the last user message (a hit rate "
                     "stuck at 0 points to a dynamic field in the system prompt)",
    "short_prompts": "a prompt of at most one block can never hit: reuse is per whole block and "
                     "the last token is always computed",
    "tool_as_user": "tool results must be rendered under the template's tool role, never as "
                    "user turns: the model then confuses tool output with new user input; fix "
                    "the template or the role mapping",
    "tool_tags": "the rendered prompt has a different number of tool tags than tool messages "
                 "(tool results rendered under another role? print the final prompt with "
                 "`hermes-async render` and count them)",
    "tool_calls": "assistant tool calls and tool results do not pair up: every call needs its "
                  "result message",
    "unknown_roles": "unknown roles are mapped to user; a tool result sent under an unknown role "
                     "is rendered as a user turn: use role 'tool'",
}
LOW_REUSE_SHARE = 0.5


@dataclass(frozen=True)
class DoctorReport:
    """Everything the doctor found; :meth:`to_dict` is the ``--json`` document's body."""

    block_size: int
    prompts: int
    reuse: ReuseFigures
    roles: RoleTotals
    unknown_roles: dict[str, int] = field(default_factory=dict)

    @property
    def reusable_share(self) -> float:
        """Served tokens / prompt tokens at the block size (0 without prompts)."""
        return self.reuse.reusable_share

    def to_dict(self) -> dict[str, Any]:
        reuse, roles = self.reuse, self.roles
        return {
            "block_size": self.block_size,
            "prompts": self.prompts,
            "tokens": reuse.tokens,
            "served_tokens": reuse.served_tokens,
            "reusable_share": round(reuse.reusable_share, 4),
            "shared_prefix_tokens": asdict(reuse.shared_prefix),
            "served_tokens_per_prompt": asdict(reuse.served),
            "short_prompts": {"count": len(reuse.short_prompt_lines),
                              "lines": reuse.short_prompt_lines},
            "divergence": [{"namespace": ns, **p.to_dict(), "share_of_prefill": round(s, 4)}
                           for ns, p, s in reuse.divergence],
            "roles": {
                "chat_prompts": roles.chat_prompts,
                "prompts_with_tools": roles.prompts_with_tools,
                "tool_messages": roles.tool_messages, "tool_calls": roles.tool_calls,
                "tool_tags": roles.tool_tags, "unknown_roles": self.unknown_roles,
                "problems": [{"line": f.line, "problem": f.problem, **asdict(f.check)}
                             for f in roles.findings],
            },
            "namespaces": {ns: {**asdict(s), "reusable_share": round(s.reusable_share, 4)}
                           for ns, s in reuse.namespaces.items()},
        }


def document(report: DoctorReport, *, file: str, model: str,
             block_size_source: str) -> dict[str, Any]:
    """The ``doctor --json`` document: where the input came from, the report, the findings."""
    body = report.to_dict()
    return {"file": file, "model": model, "block_size_source": block_size_source, **body,
            "findings": findings(body)}


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
    """The plain-text report of a :func:`document` (sections, advice under each finding)."""
    w = out.write
    w(f"hermes-async doctor: {d['file']}\n")
    w(f"model: {d['model']}; block size {d['block_size']} ({d['block_size_source']})\n")
    n, tokens = d["prompts"], d["tokens"]
    w("\n== Prompts ==\n")
    w(f"prompts: {n}, tokens: {tokens:,}" + (f" (mean {tokens / n:,.0f})" if n else "") + "\n")

    w("\n== Prefix reuse ==\n")
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

    w("\n== Dynamic fields ==\n")
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

    w("\n== Tool roles ==\n")
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
