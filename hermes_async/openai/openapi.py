"""``GET /openapi.json``: the API described by OpenAPI 3.1, generated from the msgspec
structs (request bodies: :mod:`hermes_async.openai.schemas`; answers:
:mod:`hermes_async.openai.response_types`), never written by hand.

Each operation lists its request body, its 200 answer (JSON, or ``text/event-stream`` for
``stream: true``) and the error statuses it can answer, all with OpenAI's error object. The
schema-fuzzing test (schemathesis) checks every live answer against this document.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hermes_async import __version__
from hermes_async.openai import response_types as rt
from hermes_async.openai import schemas as rq

REF = "#/components/schemas/{name}"
ERRORS_COMMON = (400, 401, 404, 408, 413, 429, 503)
STATUS_TEXT = {400: "Bad request (the error's param names the field)",
               401: "Missing or wrong API key", 403: "Another tenant's namespace",
               404: "Unknown model or route", 408: "The body arrived too slowly",
               409: "Conflict (namespace busy, pin limit)",
               413: "Body too large", 429: "Queue full (Retry-After)",
               503: "Loading or shutting down", 504: "Request timeout"}


@dataclass(frozen=True)
class Operation:
    """One endpoint of the document."""

    method: str
    path: str
    summary: str
    ok: type[msgspec.Struct] | None  # None: a text answer (Prometheus)
    body: type[msgspec.Struct] | None = None
    errors: tuple[int, ...] = ERRORS_COMMON
    streams: bool = False
    query: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # name: (type, doc)


OPERATIONS: tuple[Operation, ...] = (
    Operation("post", "/v1/chat/completions", "Chat completion (OpenAI)", rt.ChatCompletion,
              rq.ChatCompletionRequest, (*ERRORS_COMMON, 504), streams=True),
    Operation("post", "/v1/completions", "Completion (OpenAI)", rt.Completion,
              rq.CompletionRequest, (*ERRORS_COMMON, 504), streams=True),
    Operation("get", "/v1/models", "The served model", rt.ModelList, errors=(401, 503)),
    Operation("post", "/tokenize", "Token ids of a prompt or messages (vLLM)",
              rt.TokenizeResult, rq.TokenizeRequest),
    Operation("get", "/health", "Liveness and readiness", rt.Health, errors=(503,)),
    Operation("get", "/metrics", "Prometheus metrics", None, errors=()),
    Operation("get", "/cache/stats", "Prefix and assembly cache figures", rt.CacheStats,
              errors=(400, 401, 403, 503),
              query={"namespace": ("string", "only this namespace (repeatable, comma list)"),
                     "top": ("integer", "divergence points per namespace")}),
    Operation("post", "/cache/warm", "Prefill (and pin) a prompt", rt.CacheWarmResult,
              rq.CacheWarmRequest, (400, 401, 403, 404, 408, 409, 413, 429, 503)),
    Operation("post", "/cache/reset", "Drop a namespace's cached blocks", rt.CacheResetResult,
              rq.CacheResetRequest, (400, 401, 403, 404, 408, 409, 413, 503)),
    Operation("get", "/openapi.json", "This document", None, errors=()),
)


def _json(ref: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": ref}}


def _operation(op: Operation, refs: Mapping[type, dict[str, Any]]) -> dict[str, Any]:
    if op.ok is None:
        content = ({"application/json": {"schema": {"type": "object"}}}
                   if op.path == "/openapi.json" else
                   {"text/plain": {"schema": {"type": "string"}}})
    else:
        content = _json(refs[op.ok])
        if op.streams:
            content["text/event-stream"] = {"schema": {
                "type": "object", "required": ["data"],
                "properties": {"data": {"type": "string", "description": "a chunk object as "
                                        "JSON; the last event is `[DONE]`"}},
                "description": "one SSE event (comments `: keep-alive` are not events)"}}
    out: dict[str, Any] = {
        "summary": op.summary,
        "operationId": op.method + op.path.replace("/", "_").replace(".", "_"),
        "responses": {"200": {"description": "OK", "content": content}, **{
            str(code): {"description": STATUS_TEXT[code], "content": _json(refs[rt.ErrorResponse])}
            for code in op.errors}},
    }
    if op.body is not None:
        out["requestBody"] = {"required": True, "content": _json(refs[op.body])}
    if op.query:
        out["parameters"] = [{"name": name, "in": "query", "required": False,
                              "description": doc, "schema": {"type": kind}}
                             for name, (kind, doc) in op.query.items()]
    return out


def refs_of(schemas: list[Any], types: list[type], t: type) -> dict[str, Any]:
    return schemas[types.index(t)]


def openapi_document(model_name: str) -> dict[str, Any]:
    """The whole OpenAPI 3.1 document (``model_name``: the served model, in the info)."""
    types = sorted({t for op in OPERATIONS for t in (op.ok, op.body) if t is not None}
                   | {rt.ErrorResponse, rt.MessageParam}, key=lambda t: t.__name__)
    schemas, components = msgspec.json.schema_components(types, ref_template=REF)
    messages = {"type": "array", "minItems": 1, "items": refs_of(schemas, types,
                                                                  rt.MessageParam)}
    for name in ("ChatCompletionRequest",):  # decoded as list[Any]: assembly validates them
        components[name]["properties"]["messages"] = messages
    # decoded as str | list[Any] (msgspec: one array type per union), checked by
    # completion_prompts: its four shapes said precisely
    components["CompletionRequest"]["properties"]["prompt"] = rq.PROMPT_SCHEMA
    refs = dict(zip(types, schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op, refs)
    return {
        "openapi": "3.1.0",
        "info": {"title": "hermes_async", "version": __version__,
                 "description": f"OpenAI-compatible API serving {model_name}"},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
