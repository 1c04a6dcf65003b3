"""The OpenAI-compatible API as plain code over the engine's public API: no web framework.

A front end (the aiohttp server in ``hermes_async.server``, an ASGI app, a test) does:

    state = ServiceState.of(config, engine)       # once; state.start() loads the model
    ctx = RequestContext(state, resolve_caller(state.auth, path, authorization_header))
    response = await chat_completions(ctx, body)  # every Route in ROUTES works the same way
    # JSONResponse / RawResponse: write response.status, .headers, .content_type, .payload()
    # StreamingResponse: write each chunk of `async for chunk in response`, then always
    #                    `await response.aclose()` (aborts the engine requests if unfinished)

Services never raise (but cancellation): failures come back as OpenAI error objects with
their status (:mod:`~hermes_async.openai.errors` has the table); errors after a stream's first
byte become one ``data: {"error": ...}`` event and ``data: [DONE]``.

Modules: ``auth`` (keys -> tenants -> namespaces), ``state`` (the shared state, the request
context), ``schemas`` (request decoding and validation), ``errors``, ``limits``, ``responses``,
``service`` (the never-raise convention), ``sse`` (framing), ``stream`` (engine requests ->
one output stream), ``format``/``logprobs`` (response objects), ``streaming`` (a stream ->
SSE bytes), one module per endpoint group (``chat``, ``completions``, ``endpoints``,
``cache_admin``) and ``routes``.
"""

from hermes_async.openai.auth import (
    DEFAULT_TENANT,
    Authenticator,
    CacheScope,
    Caller,
    namespace_for,
    resolve_caller,
)
from hermes_async.openai.cache_admin import cache_reset, cache_stats, cache_warm
from hermes_async.openai.chat import chat_completions
from hermes_async.openai.completions import completions
from hermes_async.openai.endpoints import health, metrics, models, tokenize
from hermes_async.openai.errors import APIError, http_error, to_api_error
from hermes_async.openai.responses import (
    JSONResponse,
    RawResponse,
    Response,
    StreamingResponse,
)
from hermes_async.openai.routes import ROUTES, Route, counts_errors
from hermes_async.openai.service import answer_error
from hermes_async.openai.state import RequestContext, ServiceState

__all__ = [
    "DEFAULT_TENANT", "ROUTES", "APIError", "Authenticator", "CacheScope", "Caller",
    "JSONResponse", "RawResponse", "RequestContext", "Response", "Route", "ServiceState",
    "StreamingResponse", "answer_error", "cache_reset", "cache_stats", "cache_warm",
    "chat_completions", "completions", "counts_errors", "health", "http_error", "metrics",
    "models", "namespace_for", "resolve_caller", "to_api_error", "tokenize",
]
