"""The auth middleware: each request's caller (tenant, cache scope) from its path and
``Authorization`` header, by the OpenAI layer's rules (:mod:`hermes_async.openai.auth`: keys
-> tenants -> namespaces); 401 for a missing or wrong key where one is needed.

``DEFAULT_TENANT`` (the tenant of every request when no keys are configured, and of
``hermes-async serve --api-key``) is re-exported from there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from hermes_async.openai.auth import DEFAULT_TENANT, resolve_caller
from hermes_async.server.state import CALLER, STATE

__all__ = ["DEFAULT_TENANT", "auth_middleware"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Resolve the caller into ``request[CALLER]`` (raises the 401 ``APIError``)."""
    request[CALLER] = resolve_caller(request.app[STATE].auth, request.path,
                                     request.headers.get("Authorization"))
    return await handler(request)
