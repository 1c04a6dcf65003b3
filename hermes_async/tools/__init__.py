"""Tool calls (stdlib only; imports nothing of the package but ``hermes_async.types``).

- Parsing model output into calls, whole (:meth:`ToolCallParser.parse` -> :class:`ParsedOutput`)
  or streaming (:meth:`ToolCallParser.stream` -> :class:`ToolCallStream`, whose events are
  :class:`ContentDelta`, :class:`ToolCallStart` and :class:`ArgumentsDelta`), in four formats:
  ``generic`` (``{"tool_calls": [...]}``), ``hermes`` (``<tool_call>``), ``llama3_json``
  (``{"name", "parameters"}``) and ``mistral`` (``[TOOL_CALLS]``). :func:`parser_for` picks one
  from the chat template (or the configured name); :data:`PARSERS` lists them.
- :func:`generic_tools_prompt`: the system text the engine adds when the template has no tool
  support (:func:`template_supports_tools`).
- :func:`call_constraint`: the grammar that forces calls for ``tool_choice`` ``"required"`` or a
  named function.
"""

from hermes_async.tools.constraints import call_constraint
from hermes_async.tools.prompting import generic_tools_prompt
from hermes_async.tools.select import PARSERS, parser_for, template_supports_tools
from hermes_async.tools.streaming import ToolCallParser, ToolCallStream
from hermes_async.tools.types import (
    ArgumentsDelta,
    ContentDelta,
    ParsedOutput,
    StreamEvent,
    ToolCall,
    ToolCallStart,
)

__all__ = [
    "PARSERS",
    "ArgumentsDelta",
    "ContentDelta",
    "ParsedOutput",
    "StreamEvent",
    "ToolCall",
    "ToolCallParser",
    "ToolCallStart",
    "ToolCallStream",
    "call_constraint",
    "generic_tools_prompt",
    "parser_for",
    "template_supports_tools",
]
