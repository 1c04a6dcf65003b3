"""Tool calls on ``/v1/chat/completions``: ``tools`` + ``tool_choice`` in, OpenAI
``tool_calls`` out.

- ``tool_choice``: ``"none"`` (the default without tools; calls are neither forced nor parsed),
  ``"auto"`` (the default with tools: the model may call; its output is parsed), ``"required"``
  and ``{"type": "function", "function": {"name": ...}}``: enforced by the grammar engine
  (:func:`hermes_async.tools.call_constraint`, in the model's own call format), so even a small
  model returns a call whose arguments validate against the tool's ``parameters``.
- The parser (:meth:`AsyncEngine.tool_parser`: the configured ``tool_call_parser``, else the
  one the chat template's format points to) reads the whole output (:func:`message_of`) or the
  stream (:class:`ToolDeltas`: name first, then argument fragments, never call markup as
  content). A choice with calls finishes with ``"tool_calls"``.
"""

from __future__ import annotations

from typing import Any

from hermes_async.openai.errors import APIError
from hermes_async.tools import (
    ArgumentsDelta,
    ContentDelta,
    ParsedOutput,
    StreamEvent,
    ToolCall,
    ToolCallParser,
    ToolCallStart,
    ToolCallStream,
    call_constraint,
)
from hermes_async.types import StructuredOutput

_CHOICES = ("none", "auto", "required")


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def tool_choice_of(tools: list[dict[str, Any]] | None, tool_choice: Any) -> str | dict[str, Any]:
    """The request's effective ``tool_choice`` (validated; 400 naming ``tool_choice``)."""
    if tool_choice is None:
        return "auto" if tools else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in _CHOICES:
            raise _bad("tool_choice", f"tool_choice must be one of {', '.join(_CHOICES)} or a "
                       "named function")
        if tool_choice == "required" and not tools:
            raise _bad("tool_choice", "tool_choice 'required' needs tools")
        return tool_choice
    if not isinstance(tool_choice, dict) or tool_choice.get("type", "function") != "function":
        raise _bad("tool_choice", "tool_choice must be a string or "
                   "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    fn = tool_choice.get("function", tool_choice)
    name = fn.get("name") if isinstance(fn, dict) else None
    names = {(t.get("function") or {}).get("name") for t in tools or () if isinstance(t, dict)}
    if not isinstance(name, str) or name not in names:
        raise _bad("tool_choice", f"tool_choice names the function {name!r}, which is not "
                   "among the tools")
    return tool_choice


def forced_calls(parser: ToolCallParser, tools: list[dict[str, Any]] | None,
                 tool_choice: str | dict[str, Any],
                 parallel: bool = True) -> StructuredOutput | None:
    """The constraint of a ``required`` or named ``tool_choice`` (None otherwise); one call
    only unless ``parallel`` (OpenAI's ``parallel_tool_calls``)."""
    if not tools or tool_choice in ("none", "auto"):
        return None
    try:
        return call_constraint(parser.name, tools, tool_choice,
                               **({} if parallel else {"max_calls": 1}))
    except ValueError as e:
        raise _bad("tools", str(e)) from e


def tool_call_dict(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def message_of(parsed: ParsedOutput) -> dict[str, Any]:
    """The assistant ``message`` of a parsed output (``tool_calls`` only when there are)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content, "refusal": None}
    if parsed.tool_calls:
        message["tool_calls"] = [tool_call_dict(c) for c in parsed.tool_calls]
    return message


def finish_reason_of(reason: str | None, has_calls: bool) -> str | None:
    """OpenAI's ``tool_calls`` for a choice that stopped with calls."""
    return "tool_calls" if has_calls and reason == "stop" else reason


class ToolDeltas:
    """One streamed choice's text through its :class:`ToolCallStream`, as chat deltas."""

    def __init__(self, parser: ToolCallParser) -> None:
        self._stream: ToolCallStream = parser.stream()
        self.started = False

    def feed(self, text: str) -> list[dict[str, Any]]:
        return self._deltas(self._stream.feed(text)) if text else []

    def finish(self) -> list[dict[str, Any]]:
        return self._deltas(self._stream.finish())

    @property
    def has_calls(self) -> bool:
        return bool(self._stream.result().tool_calls)

    def _deltas(self, events: list[StreamEvent]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            if isinstance(event, ContentDelta):
                if out and "content" in out[-1]:
                    out[-1]["content"] += event.text
                else:
                    out.append({"content": event.text})
            elif isinstance(event, ToolCallStart):
                self.started = True
                out.append({"tool_calls": [{"index": event.index, "id": event.id,
                                            "type": "function",
                                            "function": {"name": event.name,
                                                         "arguments": ""}}]})
            elif isinstance(event, ArgumentsDelta):
                out.append({"tool_calls": [{"index": event.index,
                                            "function": {"arguments": event.text}}]})
        return out
