"""The aiohttp application: ``create_app(config)`` and ``start_site`` to listen.

    app = create_app(load("configs/cpu-small.toml"))
    runner, url = await start_site(app, "127.0.0.1", 8000)   # the engine starts loading
    await wait_until_ready(app)                              # optional: model loaded
    ...
    await runner.cleanup()                                   # drain, stop the engine

Every route of the OpenAI layer (``hermes_async.openai.ROUTES``) is a thin handler over its
service, plus ``GET /dashboard``. The engine lives in the app's ``cleanup_ctx``: its start
(model loading) runs in the background so the server listens at once and ``/health`` answers
503 until it is done; on shutdown new requests get 503, in-flight ones get
``server.shutdown_drain_s`` to finish, then the engine stops (aborting the rest). Handlers run
with ``handler_cancellation`` on, so a client that disconnects aborts its request at once.
:func:`start_site` sets it with the drain time and aiohttp's parser caps: pass
``runner_options(config.server)`` yourself to a ``web.AppRunner``.

The request line and header limits (``server.max_request_line_bytes``, ``max_header_bytes``,
``max_headers``) are checked by the error middleware, before authentication
(:mod:`hermes_async.server.head`): a request past them gets an OpenAI error object, 414
``uri_too_long`` or 431 ``request_header_fields_too_large``, and the connection is closed.
aiohttp's parser gets hard caps above them (4x the line and field limits, at least 64 KiB,
and twice the header count: :func:`~hermes_async.server.head.parser_limits`); a head past
those is refused by the parser before any middleware runs: 400 Bad Request in plain text,
connection closed.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from hermes_async.builder import AsyncEngine as DefaultEngine
from hermes_async.config import EngineConfig, ServerConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.openai.routes import ROUTES
from hermes_async.openai.state import ServiceState
from hermes_async.server.auth import auth_middleware
from hermes_async.server.dashboard import dashboard
from hermes_async.server.errors import error_middleware
from hermes_async.server.handlers import body_handler, query_handler
from hermes_async.server.head import parser_limits
from hermes_async.server.state import STATE


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    state.start()
    yield
    await state.stop()
    _forget_middleware_chains()


def _forget_middleware_chains() -> None:
    """Drop aiohttp's process-wide cache of middleware chains (an ``lru_cache`` of up to 1024
    entries keyed by handler and app): each entry holds its app, so a stopped app, its engine
    and the model's weights would stay in memory for as long as the process lives (a process
    that starts several servers, such as a test suite or a program embedding them, would grow
    by a model per server). Other apps only rebuild their chains on their next request."""
    from aiohttp import web_app

    cached = getattr(web_app, "_cached_build_middleware", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()


async def _on_shutdown(app: web.Application) -> None:
    app[STATE].begin_shutdown()  # new requests: 503; in-flight ones drain


def create_app(config: EngineConfig | None = None, *,
               engine: AsyncEngine | None = None) -> web.Application:
    """The OpenAI-compatible app for ``config`` (default: the embedded model).

    ``engine`` injects a prepared (not yet started) engine; otherwise
    ``hermes_async.AsyncEngine(config)`` is built. The app starts it on startup and stops it
    on cleanup.
    """
    config = config or EngineConfig()
    engine = engine or DefaultEngine(config)
    app = web.Application(middlewares=[error_middleware, auth_middleware],
                          client_max_size=config.server.max_body_bytes)
    app[STATE] = ServiceState.of(config, engine)
    app.cleanup_ctx.append(_engine_ctx)
    app.on_shutdown.append(_on_shutdown)
    for route in ROUTES:
        if route.method == "POST":
            app.router.add_post(route.path, body_handler(route.service))
        else:
            app.router.add_get(route.path, query_handler(route.service))
    app.router.add_get("/dashboard", dashboard)
    return app


async def wait_until_ready(app: web.Application) -> None:
    """Wait for the engine's start (model loading); re-raises a failed load."""
    state = app[STATE]
    if state.start_task is None:
        raise RuntimeError("the app is not started (use start_site or an AppRunner)")
    await state.wait_until_ready()


def runner_options(server: ServerConfig) -> dict[str, Any]:
    """The ``web.AppRunner`` keywords of ``server``: handler cancellation, the drain time and
    aiohttp's parser caps (request line, one header field, header count: hard caps above the
    configured limits, which the error middleware checks)."""
    return {"handler_cancellation": True, "shutdown_timeout": server.shutdown_drain_s,
            **parser_limits(server)}


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Set the app up and listen on ``host:port`` (0: a free port) with
    :func:`runner_options`; returns the runner and the URL."""
    runner = web.AppRunner(app, **runner_options(app[STATE].config.server))
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, url_of(runner, host)


def url_of(runner: web.AppRunner, host: str) -> str:
    """``http://host:port`` of the runner's first socket (the real port when 0 was asked)."""
    sock = runner.addresses[0]
    port = sock[1]
    shown = host or ("::" if len(sock) == 4 else "0.0.0.0")
    with contextlib.suppress(OSError):
        if socket.inet_pton(socket.AF_INET6, shown):
            shown = f"[{shown}]"
    return f"http://{shown}:{port}"
