"""Bounded JSON numbers: what the grammar enforces beyond the schema, so a small model cannot
run on in digits forever (greedy decoding loves ``0.12345678901234...``).

Numbers a schema leaves unbounded get, in the compiled grammar only, at most
``fraction_digits`` digits after the point (as ``multipleOf: 10**-k``) and, where the schema
sets no bound, a magnitude below ``10**integer_digits`` (llama.cpp's JSON-schema grammars bound
integers the same way). A free-form object (``{"type": "object"}``
with no ``properties``, ``patternProperties`` or ``additionalProperties``: OpenAI's
``json_object``) gets values nested at most ``free_depth`` levels deep, so the model cannot
nest forever either. Every document the grammar allows still validates against the schema as
given: this narrows the choice, it never widens it. The caller's schema is not modified.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                   "dependentSchemas")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
                  "propertyNames", "unevaluatedItems", "unevaluatedProperties")


def _types(schema: dict[str, Any]) -> set[str]:
    t = schema.get("type")
    return {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()


def free_value(depth: int) -> dict[str, Any]:
    """Any JSON value nested at most ``depth`` levels (scalars only at 0)."""
    scalars: list[dict[str, Any]] = [{"type": t} for t in
                                     ("string", "number", "boolean", "null")]
    if depth <= 0:
        return {"anyOf": scalars}
    inner = free_value(depth - 1)
    return {"anyOf": [*scalars, {"type": "array", "items": inner},
                      {"type": "object", "additionalProperties": inner}]}


def _is_free_object(schema: dict[str, Any]) -> bool:
    return _types(schema) == {"object"} and not any(
        k in schema for k in ("properties", "patternProperties", "additionalProperties",
                              "anyOf", "oneOf", "allOf", "$ref"))


def bound_numbers(schema: Any, fraction_digits: int | None, integer_digits: int | None,
                  free_depth: int | None = None) -> Any:
    """A copy of ``schema`` with its number and integer leaves bounded, and free-form objects
    nested at most ``free_depth`` deep (see the module doc); ``None`` leaves that bound off."""
    if isinstance(schema, list):
        return [bound_numbers(s, fraction_digits, integer_digits, free_depth) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if free_depth is not None and _is_free_object(out):
        out["additionalProperties"] = free_value(free_depth - 1)
    bound = (fraction_digits, integer_digits)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [bound_numbers(s, *bound) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: bound_numbers(s, *bound) for k, s in out[key].items()}
    for key in _SUBSCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = bound_numbers(out[key], *bound)
    types = _types(out)
    if types & {"number", "integer"}:
        if integer_digits is not None:
            limit = 10 ** integer_digits - 1
            if "maximum" not in out and "exclusiveMaximum" not in out:
                out["maximum"] = limit
            if "minimum" not in out and "exclusiveMinimum" not in out:
                out["minimum"] = -limit
        if "number" in types and fraction_digits is not None and "multipleOf" not in out:
            out["multipleOf"] = float(Decimal(1).scaleb(-fraction_digits))
    return out
