"""The request's tools as (name, description, parameters) and the canonical JSON text of
schemas, shared by the prompt and the constraints.

Canonical text sorts every object's keys except the keys of a ``properties`` map: the grammar
engine (llguidance) makes the model write an object's properties in the order the schema
lists them, so that order is part of the schema's meaning and is kept. Equal schemas give
equal text, so the prompt cache and the compiled-grammar cache hit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolSpec:
    """One function a request offers: its name, description and JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any]


def tool_specs(tools: list[dict[str, Any]]) -> list[ToolSpec]:
    """The request's ``tools`` (OpenAI ``{"type": "function", "function": {...}}``, or the bare
    function object) as :class:`ToolSpec`; missing or empty parameters become
    ``{"type": "object"}``. Raises ValueError on a tool without a name."""
    specs = []
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}] has no function name")
        params = fn.get("parameters") or {"type": "object"}
        if not isinstance(params, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        description = fn.get("description") or ""
        specs.append(ToolSpec(name, str(description), params))
    return specs


def canonical_json(value: Any, ensure_ascii: bool = True) -> str:
    """Compact JSON with sorted keys, except that ``properties`` maps keep their order."""
    return json.dumps(_canonical(value, False), separators=(",", ":"), ensure_ascii=ensure_ascii)


def _canonical(value: Any, keep_order: bool) -> Any:
    if isinstance(value, dict):
        keys = list(value) if keep_order else sorted(value)
        return {k: _canonical(value[k], not keep_order and k == "properties"
                              and isinstance(value[k], dict)) for k in keys}
    if isinstance(value, list | tuple):
        return [_canonical(v, False) for v in value]
    return value
