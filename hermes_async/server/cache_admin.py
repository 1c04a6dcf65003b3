"""The cache admin API: ``GET /cache/stats``, ``POST /cache/warm``, ``POST /cache/reset``.

Who sees what is the request's :class:`~hermes_async.server.auth.CacheScope`: the admin key
(or no keys configured) every namespace, a tenant's key its own. Errors are OpenAI error
objects: 403 ``namespace_forbidden`` for another tenant's namespace, 409 ``namespace_busy``
for a reset while requests run there, 409 ``pin_limit_reached`` when the pin cap refuses a pin
(the prompt is cached then, just not pinned).
"""

from __future__ import annotations

from aiohttp import web

from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.server.auth import CacheScope
from hermes_async.server.errors import APIError, json_response
from hermes_async.server.limits import read_body
from hermes_async.server.openai_chat import assemble
from hermes_async.server.schemas import CacheResetRequest, CacheWarmRequest, decode
from hermes_async.server.state import CACHE_SCOPE, STATE

ALL_NAMESPACES = "*"


async def stats(request: web.Request) -> web.Response:
    """Per-namespace cache figures (see :meth:`CacheObserver.snapshot`); ``?namespace=``
    narrows to one, ``?top=`` sets how many divergence points each lists (default 10)."""
    engine = request.app[STATE].engine_or_503()
    scope = request[CACHE_SCOPE]
    core, observer = engine.core, engine.observer
    assert core is not None and observer is not None
    wanted = request.query.get("namespace")
    if wanted is not None:
        _check_allowed(scope, wanted)
        names: list[str] = [wanted]
    else:
        seen = set(observer.namespaces()) | set(core.cache.tree.stats())
        names = [ns for ns in seen if scope.allows(ns)]
    try:
        top = max(0, min(100, int(request.query.get("top", "10"))))
    except ValueError as e:
        raise APIError(400, "top must be an integer", param="top", code="invalid_value") from e
    doc = observer.snapshot(core.cache, running=len(core.scheduler.running),
                            waiting=len(core.scheduler.waiting), namespaces=names, top=top)
    return json_response(doc)


async def warm(request: web.Request) -> web.Response:
    """Prefill a prompt into a namespace's prefix cache without answering it; with
    ``pin_ttl_s`` the cached blocks are pinned for that long (restarted on each hit)."""
    state = request.app[STATE]
    engine = state.engine_or_503()
    scope = request[CACHE_SCOPE]
    req = decode(await read_body(request, state.config.server.max_body_bytes), CacheWarmRequest)
    state.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of prompt or messages", param="prompt",
                       code="invalid_value")
    namespace = req.namespace or scope.default_namespace
    _check_allowed(scope, namespace)
    text, ids = (req.prompt, None) if isinstance(req.prompt, str) else (None, req.prompt)
    if req.messages is not None:  # assembled here: cached, counted, tools rendered
        ids = list((await assemble(engine, req.messages, req.tools, True, namespace)).token_ids)
    result = await engine.warm(text, token_ids=ids, namespace=namespace,
                               pin_ttl_s=req.pin_ttl_s)
    if result.pin_error is not None:
        raise APIError(409, f"the prompt is cached but not pinned: {result.pin_error}",
                       param="pin_ttl_s", code="pin_limit_reached")
    return json_response({
        "object": "cache.warm", "namespace": result.namespace,
        "prompt_tokens": result.prompt_tokens, "cached_tokens": result.cached_tokens,
        "already_cached_tokens": result.already_cached_tokens,
        "pinned": result.pin is not None, "pin": result.pin})


async def reset(request: web.Request) -> web.Response:
    """Drop a namespace's cached blocks and pins (``"*"``: every namespace, admin only);
    refused with 409 while requests of that namespace are in flight."""
    state = request.app[STATE]
    engine = state.engine_or_503()
    scope = request[CACHE_SCOPE]
    body = await read_body(request, state.config.server.max_body_bytes)
    req = decode(body, CacheResetRequest) if body.strip() else CacheResetRequest()
    namespace = req.namespace or scope.default_namespace
    if namespace == ALL_NAMESPACES:
        if not scope.is_admin:
            raise _forbidden(namespace)
    else:
        _check_allowed(scope, namespace)
    target = None if namespace == ALL_NAMESPACES else namespace
    freed, unpinned = _reset(engine, target)
    return json_response({"object": "cache.reset", "namespace": namespace,
                          "freed_blocks": freed, "unpinned": unpinned})


def _reset(engine: AsyncEngine, namespace: str | None) -> tuple[int, int]:
    core, observer = engine.core, engine.observer
    assert core is not None and observer is not None
    busy = sorted({r.namespace for r in core.requests.values()
                   if namespace is None or r.namespace == namespace})
    if busy:
        raise APIError(409, f"requests are in flight in {', '.join(busy)}; retry when they "
                       "are done", param="namespace", code="namespace_busy")
    unpinned = len(core.cache.pins_of(namespace))
    freed = core.cache.reset(namespace)  # no request holds blocks there: checked above
    for ns in [namespace] if namespace is not None else observer.namespaces():
        observer.detector.forget(ns)
    return freed, unpinned


def _check_allowed(scope: CacheScope, namespace: str) -> None:
    if not scope.allows(namespace):
        raise _forbidden(namespace)


def _forbidden(namespace: str) -> APIError:
    return APIError(403, f"this key may not see or manage namespace {namespace!r}",
                    type="permission_error", param="namespace", code="namespace_forbidden")
