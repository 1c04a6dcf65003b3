"""The ASGI 3 application: :class:`ASGIApp` over a :class:`~hermes_async.openai.ServiceState`.

    app = ASGIApp(ServiceState.of(config, engine))     # or create_app(config)
    uvicorn.run(app, lifespan="on")                     # or the ingress of a Ray Serve replica

**Lifespan.** On ``lifespan.startup`` (with ``manage_lifecycle``) the engine starts loading in
the background (:meth:`ServiceState.start`) and startup completes at once: ``/health``
answers 503 until the model is loaded. On ``lifespan.shutdown`` new requests get 503, in-flight
ones get ``server.shutdown_drain_s`` to finish, then the engine stops. Without
``manage_lifecycle`` the owner of the state starts and stops it (on the serving loop) and the
lifespan messages only complete. A server that runs no lifespan (``lifespan="off"``) leaves an
app that manages its life cycle answering 503: the engine is never started.

**HTTP.** Every route of ``hermes_async.openai.ROUTES`` plus ``GET /dashboard``, by exact
path (without the mount's ``root_path``) and method (``HEAD`` as ``GET``, without a body).
As in the aiohttp server: the caller is resolved first (401 for a missing or wrong key where
one is needed), then an unknown path is 404 and a known path's other methods 405 (with
``Allow``), all OpenAI error objects counted like the aiohttp server's; a POST body is read
within ``server.max_body_bytes`` (413) and ``server.body_read_timeout_s`` (408, then the
connection is closed); a GET's query is a dict of the first value of each parameter. The
service's response is written by :mod:`~hermes_async.asgi.respond` (sends bounded by
``server.write_timeout_s``, a disconnect cancels the call and closes its stream).

What the server enforces itself, the app does not see: request line and header limits
(uvicorn: ``h11_max_incomplete_event_size``; ``server.max_request_line_bytes`` and
``max_header_bytes`` are the aiohttp server's), connection counts, the graceful shutdown's
wait for open connections (uvicorn: ``timeout_graceful_shutdown``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from hermes_async.asgi.body import ClientGone, read_body
from hermes_async.asgi.dashboard import DASHBOARD_PATH, dashboard_page
from hermes_async.asgi.messages import Message, Receive, Scope, Send, header, query_of, route_path
from hermes_async.asgi.respond import SendClock, respond, serve, until_disconnect
from hermes_async.builder import AsyncEngine as DefaultEngine
from hermes_async.config import EngineConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.openai.auth import resolve_caller
from hermes_async.openai.errors import http_error
from hermes_async.openai.limits import BodyReadTimeout
from hermes_async.openai.responses import RawResponse, Response
from hermes_async.openai.routes import ROUTES, Route, counts_errors
from hermes_async.openai.service import answer_error
from hermes_async.openai.state import RequestContext, ServiceState

Routes = Mapping[str, Mapping[str, Route]]

log = logging.getLogger("hermes_async.asgi")


def routes_by_path(routes: Iterable[Route]) -> dict[str, dict[str, Route]]:
    """``path -> method -> route``."""
    table: dict[str, dict[str, Route]] = {}
    for route in routes:
        table.setdefault(route.path, {})[route.method] = route
    return table


def allowed(methods: Iterable[str]) -> str:
    """The ``Allow`` header of a path with these methods (``HEAD`` wherever ``GET`` is)."""
    names = set(methods)
    if "GET" in names:
        names.add("HEAD")
    return ", ".join(sorted(names))


def find_route(routes: Routes, path: str, method: str) -> Route:
    """The route of ``method`` on ``path``; 404 for an unknown path, 405 (with ``Allow``) for
    another method."""
    methods = routes.get(path)
    if methods is None:
        raise http_error(404, "404: Not Found")
    route = methods.get("GET" if method == "HEAD" else method)
    if route is None:
        err = http_error(405, "405: Method Not Allowed")
        err.headers["Allow"] = allowed(methods)
        raise err
    return route


class ASGIApp:
    """The OpenAI-compatible API as an ASGI 3 callable; see the module docstring."""

    def __init__(self, state: ServiceState, *, manage_lifecycle: bool = True) -> None:
        self.state = state
        self.manage_lifecycle = manage_lifecycle
        self.routes: Routes = routes_by_path(
            (*ROUTES, Route("GET", DASHBOARD_PATH, self._dashboard)))
        self._page: RawResponse | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":  # none served: refused (the server answers 403)
            await receive()
            await send({"type": "websocket.close", "code": 1008})

    # ----- lifespan ---------------------------------------------------------------------------
    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send(await _phase("startup", self._startup))
            elif message["type"] == "lifespan.shutdown":
                await send(await _phase("shutdown", self._shutdown))
                return

    async def _startup(self) -> None:
        if self.manage_lifecycle:
            self.state.start()

    async def _shutdown(self) -> None:
        if self.manage_lifecycle:
            self.state.begin_shutdown()
            await self.state.stop()

    # ----- http -------------------------------------------------------------------------------
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        clock = SendClock(send, self.state.config.server.write_timeout_s)
        head = scope["method"] == "HEAD"
        try:
            call = await self._prepare(scope, receive)
        except ClientGone:
            return
        except Exception as e:  # noqa: BLE001 - answered as an error object, never a crash
            response = answer_error(self.state, e, count=counts_errors(route_path(scope)))
            await respond(clock, response, head=head, close=isinstance(e, BodyReadTimeout))
            return
        await until_disconnect(receive, serve(clock, call, head=head))

    async def _prepare(self, scope: Scope, receive: Receive) -> Awaitable[Response]:
        """The caller, the route and its argument (the body or the query) -> the service call,
        not started yet; raises what is answered as an error."""
        path = route_path(scope)
        caller = resolve_caller(self.state.auth, path, header(scope, b"authorization"))
        route = find_route(self.routes, path, scope["method"])
        ctx = RequestContext(self.state, caller)
        if route.method == "POST":
            server = self.state.config.server
            body = await read_body(scope, receive, server.max_body_bytes,
                                   server.body_read_timeout_s)
            return route.service(ctx, body)
        return route.service(ctx, query_of(scope))

    async def _dashboard(self, ctx: RequestContext, query: Mapping[str, str]) -> Response:
        """The dashboard page (open to all: it holds no data)."""
        if self._page is None:
            self._page = dashboard_page()
        return self._page


async def _phase(name: str, action: Callable[[], Awaitable[None]]) -> Message:
    """Run a lifespan phase: ``lifespan.<name>.complete``, or ``.failed`` with the error."""
    try:
        await action()
    except Exception as e:  # noqa: BLE001 - reported to the server, which stops
        log.exception("ASGI lifespan %s failed", name)
        return {"type": f"lifespan.{name}.failed", "message": f"{type(e).__name__}: {e}"}
    return {"type": f"lifespan.{name}.complete"}


def create_app(config: EngineConfig | None = None, *, engine: AsyncEngine | None = None,
               manage_lifecycle: bool = True) -> ASGIApp:
    """The ASGI app for ``config`` (default: the embedded model); ``engine`` injects a
    prepared (not yet started) engine, otherwise ``hermes_async.AsyncEngine(config)`` is
    built (its model loads at lifespan startup)."""
    config = config or EngineConfig()
    return ASGIApp(ServiceState.of(config, engine or DefaultEngine(config)),
                   manage_lifecycle=manage_lifecycle)

