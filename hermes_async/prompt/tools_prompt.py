"""Tools for a template that cannot show them: the generic tools prompt as a system message.

When a request has ``tools`` and the chat template has no tool support (the default model's
does not), the assembler renders the conversation without ``tools`` and with the text of
:func:`hermes_async.tools.generic_tools_prompt` appended to the first system message (or as a
new first system message), so the model sees its tools and the JSON format to call them in,
and the prompt cache keys on that text like any other message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hermes_async.prompt.errors import PromptError
from hermes_async.tools import generic_tools_prompt

_SYSTEM_ROLES = ("system", "developer")


def with_generic_tools(messages: Sequence[Any], tools: list[Any],
                       tool_choice: Any) -> list[Any]:
    """``messages`` with the generic tools prompt in their system message (a copy)."""
    try:
        text = generic_tools_prompt(tools, tool_choice if tool_choice is not None else "auto")
    except ValueError as e:
        raise PromptError(str(e), param="tool_choice" if "tool_choice" in str(e) else "tools",
                          code="invalid_tools") from e
    out = list(messages)
    first = out[0] if out else None
    if isinstance(first, Mapping) and first.get("role") in _SYSTEM_ROLES and \
            isinstance(first.get("content"), str):
        out[0] = {**first, "content": f"{first['content']}\n\n{text}"}
    else:
        out.insert(0, {"role": "system", "content": text})
    return out
