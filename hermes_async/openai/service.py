"""The service convention: ``async def name(ctx, arg) -> Response`` that never raises.

A POST service takes the request body (``bytes``), a GET service the query parameters (a
``Mapping[str, str]``). :func:`service` wraps one so that every failure comes back as the
JSON error response :func:`answer_error` makes (cancellation still propagates: a front end
cancels a call whose client went away, and the call's own ``finally`` aborts its engine
requests). A front end calls :func:`answer_error` itself for what fails outside a service
(authentication, body size, unknown routes).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from hermes_async.openai.errors import to_api_error
from hermes_async.openai.responses import JSONResponse, Response, error_response
from hermes_async.openai.state import RequestContext, ServiceState

A = TypeVar("A")
Service = Callable[[RequestContext, A], Awaitable[Response]]
BodyService = Callable[[RequestContext, bytes], Awaitable[Response]]
QueryService = Callable[[RequestContext, Mapping[str, str]], Awaitable[Response]]


def answer_error(state: ServiceState, exc: BaseException, *, count: bool = True) -> JSONResponse:
    """The error response of ``exc`` (see :func:`~hermes_async.openai.errors.to_api_error`),
    counted in ``hermes_request_errors_total{code}`` when ``count`` and not counted yet (the
    engine counts its own)."""
    err = to_api_error(exc, state.retry_after_s)
    if count and not err.counted:
        state.engine.metrics.request_errors.labels(err.code or "unknown").inc()
    return error_response(err)


def service(*, count_errors: bool = True) -> Callable[[Service[A]], Service[A]]:
    """Make ``fn`` answer its failures as error responses (``count_errors`` False: a probe,
    whose failures are not request errors)."""
    def wrap(fn: Service[A]) -> Service[A]:
        @functools.wraps(fn)
        async def call(ctx: RequestContext, arg: A) -> Response:
            try:
                return await fn(ctx, arg)
            except Exception as e:  # noqa: BLE001 - answered as an error object
                return answer_error(ctx.state, e, count=count_errors)
        return call
    return wrap
