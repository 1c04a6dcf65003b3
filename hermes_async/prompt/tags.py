"""Role tags of a rendered prompt: a template control token plus the role word after it.

The one definition of a role tag and of a tool tag, shared by ``hermes-async render`` (its tool
check) and the prompt doctor (its role checks): a tool result rendered under another role shows
up as a tool message without a tool tag.
"""

from __future__ import annotations

from collections import Counter

from hermes_async.prompt.assembler import InspectedPrompt
from hermes_async.prompt.roles import ROLE_TABLE

_TOOL_WORDS = {"tool", "function", "ipython"}
_TOOL_CONTROL_HINTS = ("tool_result", "tool_response", "tool_output")


def role_tags(inspected: InspectedPrompt) -> Counter[str]:
    """Count template control tokens, each with the role word that follows it, if any."""
    tags: Counter[str] = Counter()
    segs = inspected.segments
    for i, (text, is_control) in enumerate(segs):
        if not is_control:
            continue
        word = ""
        if i + 1 < len(segs) and not segs[i + 1][1]:
            head = segs[i + 1][0].lstrip()
            word = head.split(None, 1)[0] if head else ""
            word = word if word.lower() in ROLE_TABLE or word.lower() in _TOOL_WORDS else ""
        tags[text + word] += 1
    return tags


def is_tool_tag(tag: str) -> bool:
    """Whether a role tag of :func:`role_tags` opens a tool result (``<|im_start|>tool``,
    ``<tool_response>``, ...); closing tags (with ``/``) do not count."""
    low = tag.lower()
    if low.endswith(tuple(_TOOL_WORDS)):
        return True
    return any(h in low for h in _TOOL_CONTROL_HINTS) and "/" not in low
