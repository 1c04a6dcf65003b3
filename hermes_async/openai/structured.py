"""Structured-output fields of a request -> one :class:`StructuredOutput` (or none).

Accepted, as OpenAI and vLLM spell them (at most one per request, else 400):

- ``response_format``: ``{"type": "text"}`` (none), ``{"type": "json_object"}`` (any JSON
  object), ``{"type": "json_schema", "json_schema": {"name", "schema", "strict",
  "description"}}``;
- vLLM's ``structured_outputs``: ``{"json": schema, "regex": str, "choice": [str],
  "grammar": str, "json_object": true}`` (exactly one key of those; the backend options
  ``disable_fallback``, ``disable_any_whitespace``, ``disable_additional_properties``,
  ``whitespace_pattern`` are accepted and ignored);
- vLLM's older ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar`` (and
  ``guided_decoding_backend``/``guided_whitespace_pattern``, ignored).

The canonical spec keeps a schema's key order (llguidance emits properties in schema order),
with compact separators, so equal requests hit the compiled-grammar cache.
"""

from __future__ import annotations

import json
from typing import Any

from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.engine.request import CompiledConstraint
from hermes_async.openai.errors import APIError
from hermes_async.types import GuideKind, SamplingParams, StructuredOutput

_STRUCTURED_KEYS = {"json": GuideKind.JSON, "regex": GuideKind.REGEX,
                    "choice": GuideKind.CHOICE, "grammar": GuideKind.GRAMMAR}
_IGNORED_OPTIONS = {"disable_fallback", "disable_any_whitespace",
                    "disable_additional_properties", "whitespace_pattern", "backend"}
JSON_OBJECT_SCHEMA = '{"type":"object"}'


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def canonical_json(value: Any, param: str) -> str:
    """A schema (object, or its JSON text) as compact JSON text, key order kept."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise _bad(param, f"the JSON schema is not valid JSON: {e}") from e
    if not isinstance(value, dict | bool):
        raise _bad(param, "a JSON schema must be an object (or true/false)")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _from_value(kind: GuideKind, value: Any, param: str) -> StructuredOutput:
    if kind is GuideKind.JSON:
        return StructuredOutput(kind, canonical_json(value, param))
    if kind is GuideKind.CHOICE:
        if not isinstance(value, list) or not value or \
                not all(isinstance(c, str) and c for c in value):
            raise _bad(param, "choice must be a non-empty list of non-empty strings")
        return StructuredOutput(kind, json.dumps(value, ensure_ascii=False))
    if not isinstance(value, str) or not value.strip():
        raise _bad(param, f"{kind} must be a non-empty string")
    return StructuredOutput(kind, value)


def from_response_format(fmt: dict[str, Any] | None) -> StructuredOutput | None:
    """OpenAI's ``response_format``."""
    if fmt is None:
        return None
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(GuideKind.JSON, JSON_OBJECT_SCHEMA)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise _bad("response_format.json_schema", "response_format json_schema needs a "
                       "'json_schema' object with 'name' and 'schema'")
        if "schema" not in spec:
            raise _bad("response_format.json_schema.schema",
                       "response_format.json_schema needs a 'schema'")
        return _from_value(GuideKind.JSON, spec["schema"], "response_format.json_schema.schema")
    raise _bad("response_format.type", f"response_format type {kind!r} is not one of "
               "'text', 'json_object', 'json_schema'")


def from_structured_outputs(spec: dict[str, Any] | None) -> StructuredOutput | None:
    """vLLM's ``structured_outputs`` object."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise _bad("structured_outputs", "structured_outputs must be an object")
    unknown = sorted(set(spec) - set(_STRUCTURED_KEYS) - _IGNORED_OPTIONS - {"json_object"})
    if unknown:
        raise APIError(400, f"structured_outputs.{unknown[0]} is not supported",
                       param=f"structured_outputs.{unknown[0]}", code="unsupported_parameter")
    given = [k for k in _STRUCTURED_KEYS if spec.get(k) is not None]
    if spec.get("json_object"):
        given.append("json_object")
    if len(given) != 1:
        raise _bad("structured_outputs", "structured_outputs needs exactly one of json, regex, "
                   "choice, grammar, json_object")
    key = given[0]
    if key == "json_object":
        return StructuredOutput(GuideKind.JSON, JSON_OBJECT_SCHEMA)
    return _from_value(_STRUCTURED_KEYS[key], spec[key], f"structured_outputs.{key}")


def from_guided(fields: dict[str, Any]) -> StructuredOutput | None:
    """vLLM's older ``guided_*`` fields (``fields``: name -> value, None when absent)."""
    given = [(k, v) for k, v in fields.items() if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise _bad(given[1][0], f"give only one of {', '.join(k for k, _ in given)}")
    name, value = given[0]
    return _from_value(_STRUCTURED_KEYS[name.removeprefix("guided_")], value, name)


def request_structured(response_format: dict[str, Any] | None,
                       structured_outputs: dict[str, Any] | None,
                       guided: dict[str, Any]) -> StructuredOutput | None:
    """The one constraint of a request; 400 when more than one way is used at once."""
    found = [(name, s) for name, s in (
        ("response_format", from_response_format(response_format)),
        ("structured_outputs", from_structured_outputs(structured_outputs)),
        ("guided_*", from_guided(guided))) if s is not None]
    if len(found) > 1:
        raise _bad(found[1][0], f"{found[0][0]} and {found[1][0]} cannot be used together")
    return found[0][1] if found else None


async def compile_constraint(engine: AsyncEngine, params: SamplingParams,
                             param: str) -> CompiledConstraint | None:
    """``params.structured`` compiled by the engine (cached, off the loop), or None; an
    invalid constraint raises ``InvalidParameter`` naming ``param`` (400)."""
    if params.structured is None:
        return None
    return await engine.compile_grammar(params.structured, param)
