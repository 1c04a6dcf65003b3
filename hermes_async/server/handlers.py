"""aiohttp handlers as thin adapters over the OpenAI layer's services: request in (the body
within ``server.max_body_bytes`` and ``server.body_read_timeout_s``, or the query), the
caller's context, the service's response out (:mod:`~hermes_async.server.respond`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from hermes_async.openai.service import BodyService, QueryService
from hermes_async.server.body import read_body
from hermes_async.server.respond import respond
from hermes_async.server.state import STATE, context_of

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def body_handler(service: BodyService) -> Handler:
    """A POST handler: ``service(ctx, body)``."""
    async def handle(request: web.Request) -> web.StreamResponse:
        server = request.app[STATE].config.server
        body = await read_body(request, server.max_body_bytes, server.body_read_timeout_s)
        return await respond(request, await service(context_of(request), body))
    return handle


def query_handler(service: QueryService) -> Handler:
    """A GET handler: ``service(ctx, query)``."""
    async def handle(request: web.Request) -> web.StreamResponse:
        return await respond(request, await service(context_of(request), request.query))
    return handle
