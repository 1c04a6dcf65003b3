"""The error middleware: whatever fails outside a service (authentication, body size, an
unknown route or method) becomes the OpenAI layer's error response, counted in
``hermes_request_errors_total{code}`` except on the ``/health`` probe. Services answer their
own failures (:mod:`hermes_async.openai.service`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from hermes_async.openai.errors import http_error
from hermes_async.openai.routes import counts_errors
from hermes_async.openai.service import answer_error
from hermes_async.server.respond import plain_response
from hermes_async.server.state import STATE

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure -> OpenAI error object with its status."""
    failure: BaseException
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        failure = http_error(e.status, e.text or e.reason)
    except Exception as e:  # noqa: BLE001 - answered as an error object, never a crash
        failure = e
    return plain_response(answer_error(request.app[STATE], failure,
                                       count=counts_errors(request.path)))
