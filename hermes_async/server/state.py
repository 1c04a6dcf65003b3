"""Typed application and request state (``web.AppKey`` / ``web.RequestKey``), no globals.

``app[STATE]`` is the OpenAI layer's :class:`~hermes_async.openai.ServiceState` (config,
engine, key table, life cycle); ``request[CALLER]`` the caller the auth middleware resolved.
:func:`context_of` is what a handler hands to a service.
"""

from __future__ import annotations

from aiohttp import web

from hermes_async.openai.auth import Caller
from hermes_async.openai.state import RequestContext, ServiceState

STATE = web.AppKey("hermes_state", ServiceState)
CALLER = web.RequestKey("hermes_caller", Caller)


def context_of(request: web.Request) -> RequestContext:
    """The service context of ``request`` (after the auth middleware)."""
    return RequestContext(request.app[STATE], request[CALLER])
