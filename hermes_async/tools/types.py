"""The tool-call data the parsers produce: whole outputs and streaming events (plain data)."""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass

_ALNUM = string.ascii_letters + string.digits


@dataclass(frozen=True)
class ToolCall:
    """One function call the model made.

    id: ``call_`` + 24 random hex digits (Mistral: 9 alphanumerics, or the id the model gave).
    name: the function's name as the model wrote it.
    arguments: the JSON text of the arguments object (exactly as the model wrote it where the
        format embeds it as JSON, else ``json.dumps`` of it); always valid JSON of an object.
    """

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedOutput:
    """A whole output split into text and calls.

    content: the text outside the calls (all of it, in order, markup of malformed calls
        included), or None when there are calls and that text is empty or whitespace only.
    tool_calls: the calls in output order (empty when the output made none).
    """

    content: str | None
    tool_calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class ContentDelta:
    """Streaming: more plain text (text outside calls)."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """Streaming: call number ``index`` (0, 1, ... in output order) began; its name is complete."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    """Streaming: the next fragment of call ``index``'s arguments JSON text."""

    index: int
    text: str


StreamEvent = ContentDelta | ToolCallStart | ArgumentsDelta


def new_call_id() -> str:
    """A fresh OpenAI-style call id: ``call_`` + 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


def new_mistral_id() -> str:
    """A fresh Mistral-style call id: 9 random alphanumerics (what Mistral templates require)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))
