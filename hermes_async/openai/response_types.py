"""The shapes of the API's JSON answers as msgspec structs: the OpenAPI document's response
schemas are generated from them (:mod:`hermes_async.openai.openapi`), and the schema-fuzzing
test checks every live answer against that document.

They describe what the services build (as plain dicts, for speed); a field here that a
service stops sending, or a new field, fails the fuzzing test until both agree.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class MessageParam(msgspec.Struct, omit_defaults=True):
    """A chat message as the document describes it (the server also takes content parts,
    legacy ``function`` messages and unknown roles, normalized by prompt assembly)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str
    name: str | None = None
    tool_call_id: str | None = None


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct):
    """Every error: OpenAI's object."""

    error: ErrorDetail


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str


class ToolCall(msgspec.Struct):
    id: str
    type: str
    function: FunctionCall


class ChatMessage(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessage
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class ChatCompletion(msgspec.Struct):
    id: str
    object: str
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class Completion(msgspec.Struct):
    id: str
    object: str
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: Usage


class Model(msgspec.Struct):
    id: str
    object: str
    created: int
    owned_by: str
    root: str
    parent: None
    max_model_len: int


class ModelList(msgspec.Struct):
    object: str
    data: list[Model]


class TokenizeResult(msgspec.Struct):
    tokens: list[int]
    count: int
    max_model_len: int


class Health(msgspec.Struct):
    status: str


class CacheStats(msgspec.Struct):
    """``/cache/stats``: the pool and per-namespace figures (README, "Seeing the caches")."""

    time: float
    block_size: int
    window_s: float
    engine: dict[str, int]
    blocks: dict[str, float]
    totals: dict[str, Any]
    namespaces: dict[str, Any]
    grammar: dict[str, float] | None = None
    speculative: dict[str, Any] | None = None  # with speculative decoding on


class CacheWarmResult(msgspec.Struct):
    object: str
    namespace: str
    prompt_tokens: int
    cached_tokens: int
    already_cached_tokens: int
    pinned: bool
    pin: dict[str, Any] | None


class CacheResetResult(msgspec.Struct):
    object: str
    namespace: str
    freed_blocks: int
    unpinned: int
