"""The error middleware: whatever fails outside a service (authentication, body size, an
unknown route or method) becomes the OpenAI layer's error response, counted in
``hermes_request_errors_total{code}`` except on the ``/health`` probe. Services answer their
own failures (:mod:`hermes_async.openai.service`). A body that did not arrive in time (408)
is answered at once and the connection closed: reading the rest of a slow body would keep it.
A request head past the configured limits (414, 431: :mod:`hermes_async.server.head`) is
refused before anything else runs, and its connection closed the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from hermes_async.openai.errors import http_error
from hermes_async.openai.routes import counts_errors
from hermes_async.openai.service import answer_error
from hermes_async.server.body import BodyReadTimeout
from hermes_async.server.head import head_error
from hermes_async.server.respond import plain_response, send
from hermes_async.server.state import STATE

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure -> OpenAI error object with its status; a head past the limits first."""
    state = request.app[STATE]
    head = head_error(request, state.config.server)
    failure: BaseException
    if head is not None:
        failure = head
    else:
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            failure = http_error(e.status, e.text or e.reason)
        except Exception as e:  # noqa: BLE001 - answered as an error object, never a crash
            failure = e
    response = plain_response(answer_error(state, failure, count=counts_errors(request.path)))
    if failure is head or isinstance(failure, BodyReadTimeout):
        return await send(request, response, close=True)
    return response
