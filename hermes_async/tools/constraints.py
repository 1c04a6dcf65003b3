"""Constraints that force tool calls (``tool_choice`` ``"required"`` or a named function), in
each parser's own format, for the grammar engine (llguidance).

Each call is ``{"name": NAME, ARGS_KEY: PARAMS}`` with ``name`` first (llguidance keeps the
schema's property order) and the arguments matching that tool's ``parameters`` schema.
``"required"``: one or more calls (parallel allowed), each of any tool; a named choice: exactly
one call of that tool.

- generic: a JSON schema, ``{"tool_calls": [call, ...]}``.
- hermes: a Lark grammar, ``<tool_call>\\n{call}\\n</tool_call>`` blocks joined by ``\\n``.
- llama3_json: a Lark grammar, ``{"name": ..., "parameters": ...}`` calls joined by ``"; "``.
- mistral: a Lark grammar, ``[TOOL_CALLS]`` then a JSON array of calls.

The Lark grammars embed the call schemas with llguidance's ``%json {...}``. Markers are matched
as text (``[TOOL_CALLS]`` a tokenizer has as a special token is then spelled out in ordinary
tokens). Specs are canonical text (:func:`~hermes_async.tools.schema.canonical_json`), so equal
requests compile once.
"""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

from hermes_async.tools.prompting import named_choice
from hermes_async.tools.schema import ToolSpec, canonical_json, tool_specs
from hermes_async.types import GuideKind, StructuredOutput

_ARGS_KEY = MappingProxyType({"generic": "arguments", "hermes": "arguments",
                              "llama3_json": "parameters", "mistral": "arguments"})


def _call_schema(spec: ToolSpec, args_key: str) -> dict[str, Any]:
    return {"type": "object",
            "properties": {"name": {"const": spec.name}, args_key: spec.parameters},
            "required": ["name", args_key], "additionalProperties": False}


def _one_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _lark(literal: str) -> str:
    return json.dumps(literal)


MAX_PARALLEL_CALLS = 8
"""Most calls a ``"required"`` answer may hold (a small model would otherwise repeat calls
until ``max_tokens``)."""


def call_constraint(parser_name: str, tools: list[dict[str, Any]],
                    tool_choice: str | dict[str, Any],
                    max_calls: int = MAX_PARALLEL_CALLS) -> StructuredOutput:
    """The constraint that forces the calls ``tool_choice`` asks for, in ``parser_name``'s format.

    ``tool_choice`` must be ``"required"`` (1 to ``max_calls`` calls; 1 when the request says
    ``parallel_tool_calls: false``) or ``{"type": "function", "function": {"name": N}}``;
    raises ValueError for another choice, an unknown parser, no tools, or a name that is not
    among the tools.
    """
    if parser_name not in _ARGS_KEY:
        raise ValueError(f"unknown tool call parser {parser_name!r}; choices: "
                         + ", ".join(sorted(_ARGS_KEY)))
    specs = tool_specs(tools)
    forced = named_choice(tool_choice)
    if forced is not None:
        specs = [s for s in specs if s.name == forced][:1]
        if not specs:
            raise ValueError(f"tool_choice names {forced!r}, which is not among the tools")
    elif tool_choice != "required":
        raise ValueError(f"tool_choice {tool_choice!r} forces no call (only 'required' or a "
                         "named function do)")
    if not specs:
        raise ValueError("tool_choice 'required' needs at least one tool")
    args_key = _ARGS_KEY[parser_name]
    call = _one_of([_call_schema(s, args_key) for s in specs])
    single = forced is not None or max_calls <= 1
    if parser_name in ("generic", "mistral"):
        calls: dict[str, Any] = {"type": "array", "items": call, "minItems": 1,
                                 "maxItems": 1 if single else max_calls}
        if parser_name == "generic":
            schema = {"type": "object", "properties": {"tool_calls": calls},
                      "required": ["tool_calls"], "additionalProperties": False}
            return StructuredOutput(GuideKind.JSON, canonical_json(schema))
        grammar = f"start: {_lark('[TOOL_CALLS]')} %json {canonical_json(calls)}\n"
        return StructuredOutput(GuideKind.GRAMMAR, grammar)
    body = f"%json {canonical_json(call)}"
    if parser_name == "hermes":
        body = " ".join((_lark("<tool_call>\n"), body, _lark("\n</tool_call>")))
        sep = _lark("\n")
    else:
        sep = _lark("; ")
    start = "start: call" if single else f"start: call ({sep} call){{0,{max_calls - 1}}}"
    return StructuredOutput(GuideKind.GRAMMAR, f"{start}\ncall: {body}\n")
