"""The aiohttp application: ``create_app(config)`` and ``start_site`` to listen.

    app = create_app(load("configs/cpu-small.toml"))
    runner, url = await start_site(app, "127.0.0.1", 8000)   # the engine starts loading
    await wait_until_ready(app)                              # optional: model loaded
    ...
    await runner.cleanup()                                   # drain, stop the engine

The engine lives in the app's ``cleanup_ctx``: its start (model loading) runs in the
background so the server listens at once and ``/health`` answers 503 until it is done; on
shutdown new requests get 503, in-flight ones get ``server.shutdown_drain_s`` to finish, then
the engine stops (aborting the rest). Handlers run with ``handler_cancellation`` on (set by
:func:`start_site`; pass it yourself to ``web.run_app``/``web.AppRunner``), so a client that
disconnects aborts its request at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from hermes_async.config import EngineConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.server import cache_admin, endpoints
from hermes_async.server.auth import (
    CACHE_ADMIN_PREFIX,
    DEFAULT_TENANT,
    Authenticator,
    is_protected,
)
from hermes_async.server.dashboard import dashboard
from hermes_async.server.errors import to_api_error
from hermes_async.server.openai_chat import chat_completions
from hermes_async.server.openai_completions import completions
from hermes_async.server.state import CACHE_SCOPE, STATE, TENANT, ServerState

log = logging.getLogger("hermes_async.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure -> OpenAI error object with its status (counted in
    ``hermes_request_errors_total{code}`` except ``/health`` probes)."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        err = to_api_error(e, request.app[STATE].retry_after_s)
    except Exception as e:  # noqa: BLE001 - answered as an error object, never a crash
        err = to_api_error(e, request.app[STATE].retry_after_s)
    if request.path != "/health" and not err.counted:
        request.app[STATE].engine.metrics.request_errors.labels(err.code or "unknown").inc()
    return err.response()


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Resolve the API key of protected paths to the request's tenant, and of the cache
    admin paths to the namespaces it may see (401 otherwise)."""
    state = request.app[STATE]
    if request.path.startswith(CACHE_ADMIN_PREFIX):
        request[CACHE_SCOPE] = state.auth.cache_scope(request.headers.get("Authorization"))
        request[TENANT] = DEFAULT_TENANT
    elif is_protected(request.path):
        request[TENANT] = state.auth.tenant_for(request.headers.get("Authorization"))
    else:
        request[TENANT] = DEFAULT_TENANT
    return await handler(request)


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    state.start_task = asyncio.create_task(state.engine.start(), name="hermes-engine-start")
    state.start_task.add_done_callback(_log_start)
    yield
    state.stopping = True
    await asyncio.wait([state.start_task])  # never leave a half-loaded engine behind
    await state.engine.stop(drain_timeout_s=state.config.server.shutdown_drain_s)


def _log_start(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the engine failed to start: %s", task.exception())


async def _on_shutdown(app: web.Application) -> None:
    app[STATE].stopping = True  # new requests: 503; in-flight ones drain


def create_app(config: EngineConfig | None = None, *,
               engine: AsyncEngine | None = None) -> web.Application:
    """The OpenAI-compatible app for ``config`` (default: the embedded model).

    ``engine`` injects a prepared (not yet started) engine; otherwise one is built from
    ``config``. The app starts it on startup and stops it on cleanup.
    """
    config = config or EngineConfig()
    engine = engine or AsyncEngine(config)
    app = web.Application(middlewares=[error_middleware, auth_middleware],
                          client_max_size=config.server.max_body_bytes)
    app[STATE] = ServerState(config, engine, Authenticator(config.server.api_keys,
                                                           config.server.admin_key))
    app.cleanup_ctx.append(_engine_ctx)
    app.on_shutdown.append(_on_shutdown)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", endpoints.models)
    app.router.add_post("/tokenize", endpoints.tokenize)
    app.router.add_get("/health", endpoints.health)
    app.router.add_get("/metrics", endpoints.metrics)
    app.router.add_get("/cache/stats", cache_admin.stats)
    app.router.add_post("/cache/warm", cache_admin.warm)
    app.router.add_post("/cache/reset", cache_admin.reset)
    app.router.add_get("/dashboard", dashboard)
    return app


async def wait_until_ready(app: web.Application) -> None:
    """Wait for the engine's start (model loading); re-raises a failed load."""
    task = app[STATE].start_task
    if task is None:
        raise RuntimeError("the app is not started (use start_site or an AppRunner)")
    await asyncio.shield(task)


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Set the app up and listen on ``host:port`` (0: a free port), with handler
    cancellation on and the configured drain time; returns the runner and the URL."""
    runner = web.AppRunner(app, handler_cancellation=True,
                           shutdown_timeout=app[STATE].config.server.shutdown_drain_s)
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
