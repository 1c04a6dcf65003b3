"""The cache admin API: ``GET /cache/stats``, ``POST /cache/warm``, ``POST /cache/reset``.

Who sees what is the caller's :class:`~hermes_async.openai.auth.CacheScope`: the admin key
(or no keys configured) every namespace, a tenant's key its own. Errors are OpenAI error
objects: 403 ``namespace_forbidden`` for another tenant's namespace, 409 ``namespace_busy``
for a reset while requests of that namespace are in flight (the engine's one busy rule,
``NamespaceBusyError``), 409 ``pin_limit_reached`` when the pin cap refuses a pin (the prompt
is cached then, just not pinned).
"""

from __future__ import annotations

from collections.abc import Mapping

from hermes_async.openai.auth import CacheScope
from hermes_async.openai.errors import APIError
from hermes_async.openai.responses import JSONResponse, Response
from hermes_async.openai.schemas import CacheResetRequest, CacheWarmRequest, decode
from hermes_async.openai.service import service
from hermes_async.openai.state import RequestContext

ALL_NAMESPACES = "*"


@service()
async def cache_stats(ctx: RequestContext, query: Mapping[str, str]) -> Response:
    """Per-namespace cache figures (``AsyncEngine.cache_stats``); ``?namespace=`` narrows to
    one, ``?top=`` sets how many divergence points each lists (default 10, at most 100)."""
    engine = ctx.state.engine_or_503()
    scope = ctx.scope
    wanted = query.get("namespace")
    if wanted is not None:
        _check_allowed(scope, wanted)
        names = [wanted]
    else:
        names = [ns for ns in await engine.report_cache_namespaces() if scope.allows(ns)]
    try:
        top = max(0, min(100, int(query.get("top", "10"))))
    except ValueError as e:
        raise APIError(400, "top must be an integer", param="top", code="invalid_value") from e
    return JSONResponse(await engine.report_cache_stats(names, top=top))


@service()
async def cache_warm(ctx: RequestContext, body: bytes) -> Response:
    """Prefill a prompt into a namespace's prefix cache without answering it; with
    ``pin_ttl_s`` the cached blocks are pinned for that long (restarted on each hit)."""
    state = ctx.state
    engine = state.engine_or_503()
    scope = ctx.scope
    req = decode(body, CacheWarmRequest)
    state.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of prompt or messages", param="prompt",
                       code="invalid_value")
    namespace = req.namespace or scope.default_namespace
    _check_allowed(scope, namespace)
    text, ids = (req.prompt, None) if isinstance(req.prompt, str) else (None, req.prompt)
    result = await engine.warm(text, messages=req.messages, token_ids=ids, tools=req.tools,
                               namespace=namespace, pin_ttl_s=req.pin_ttl_s)
    if result.pin_error is not None:
        raise APIError(409, f"the prompt is cached but not pinned: {result.pin_error}",
                       param="pin_ttl_s", code="pin_limit_reached")
    return JSONResponse({
        "object": "cache.warm", "namespace": result.namespace,
        "prompt_tokens": result.prompt_tokens, "cached_tokens": result.cached_tokens,
        "already_cached_tokens": result.already_cached_tokens,
        "pinned": result.pin is not None, "pin": result.pin})


@service()
async def cache_reset(ctx: RequestContext, body: bytes) -> Response:
    """Drop a namespace's cached blocks and pins (``"*"``: every namespace, admin only);
    refused with 409 while requests of that namespace are in flight. An empty body: the
    caller's own namespace."""
    engine = ctx.state.engine_or_503()
    scope = ctx.scope
    req = decode(body, CacheResetRequest) if body.strip() else CacheResetRequest()
    namespace = req.namespace or scope.default_namespace
    if namespace == ALL_NAMESPACES:
        if not scope.is_admin:
            raise _forbidden(namespace)
    else:
        _check_allowed(scope, namespace)
    result = await engine.clear_cache(None if namespace == ALL_NAMESPACES else namespace)
    return JSONResponse({"object": "cache.reset", "namespace": namespace,
                         "freed_blocks": result.freed_blocks, "unpinned": result.unpinned})


def _check_allowed(scope: CacheScope, namespace: str) -> None:
    if not scope.allows(namespace):
        raise _forbidden(namespace)


def _forbidden(namespace: str) -> APIError:
    return APIError(403, f"this key may not see or manage namespace {namespace!r}",
                    type="permission_error", param="namespace", code="namespace_forbidden")
