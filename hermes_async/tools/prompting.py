"""The system text the engine adds when the chat template has no tool support (like
llama.cpp's generic tool handler): the tools, and how to answer with calls in the generic
format (:mod:`hermes_async.tools.generic`). The text is deterministic (canonical schemas, the
request's tool order), so equal requests share a cached prompt prefix.
"""

from __future__ import annotations

from typing import Any

from hermes_async.tools.schema import canonical_json, tool_specs

_FORMAT = ('{"tool_calls": [{"name": "<tool name>", "arguments": {<the arguments: a JSON object '
           'matching the tool\'s parameters>}}]}')


def named_choice(tool_choice: str | dict[str, Any]) -> str | None:
    """The function name a ``{"type": "function", "function": {"name": ...}}`` choice forces
    (the bare ``{"type": "function", "name": ...}`` too), else None."""
    if not isinstance(tool_choice, dict):
        return None
    fn = tool_choice.get("function", tool_choice)
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError("a tool_choice object needs a function name")
    return name


def generic_tools_prompt(tools: list[dict[str, Any]], tool_choice: str | dict[str, Any]) -> str:
    """The system text for tool calls with a template that has no tool support.

    It lists each tool's name, description and JSON-schema parameters, and says how to call:
    reply with exactly one JSON object ``{"tool_calls": [{"name": ..., "arguments": {...}}]}``
    and nothing else (several entries to call several tools). ``tool_choice``: ``"auto"`` adds
    that the model may answer in plain text instead; ``"required"`` that it must call at least
    one tool; a named choice that it must call that tool; ``"none"`` that it must not call any.
    """
    forced = named_choice(tool_choice)
    specs = tool_specs(tools)
    if forced is not None and forced not in {s.name for s in specs}:
        raise ValueError(f"tool_choice names {forced!r}, which is not among the tools")
    lines = ["# Tools", "", "You can call these tools (functions):"]
    for spec in specs:
        lines += ["", f"## {spec.name}"]
        if spec.description:
            lines.append(spec.description.strip())
        lines.append("Parameters (JSON schema): "
                     + canonical_json(spec.parameters, ensure_ascii=False))
    lines += ["", "# How to call tools", "",
              "To call tools, reply with exactly one JSON object of this form and nothing else "
              "(no text before or after it):", _FORMAT,
              'List several entries in "tool_calls" to call several tools at once. The result '
              "of each call will be given to you in a later message."]
    if forced is not None:
        lines.append(f'You must call the tool "{forced}", once.')
    elif tool_choice == "required":
        lines.append("You must call at least one tool.")
    elif tool_choice == "none":
        lines.append("Do not call any tool now: answer in plain text.")
    else:
        lines.append("If no tool is needed, answer in plain text instead, without any JSON.")
    return "\n".join(lines)
