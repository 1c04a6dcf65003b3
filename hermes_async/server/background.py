"""``BackgroundServer``: the aiohttp app served from a thread with its own event loop.

For tests, soaks and synchronous programs that want a live server in-process:

    srv = BackgroundServer(config).start()     # listens on 127.0.0.1 (a free port), model loaded
    ...  requests to srv.base_url ...
    srv.call(lambda: srv.engine.load())         # engine state is only consistent on its loop
    srv.stop()                                  # drain, stop the engine; re-raises its errors

``make_engine`` injects a prepared engine (e.g. one on a fake runner); ``middlewares`` are
appended to the app before it starts; ``on_cleanup`` runs on the server loop just before the
app's cleanup (drain, engine stop).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from hermes_async.config import EngineConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.openai.state import ServiceState
from hermes_async.server.app import create_app, start_site, wait_until_ready
from hermes_async.server.state import STATE

T = TypeVar("T")


class BackgroundServer:
    """``create_app(config, engine=make_engine())`` on ``host:port`` from a daemon thread."""

    def __init__(self, config: EngineConfig, *,
                 make_engine: Callable[[], AsyncEngine] | None = None,
                 middlewares: Sequence[Any] = (), on_cleanup: Callable[[], None] | None = None,
                 host: str = "127.0.0.1", port: int = 0, name: str = "hermes-server") -> None:
        self.config = config
        self.make_engine = make_engine
        self.middlewares = list(middlewares)
        self.on_cleanup = on_cleanup
        self.host, self.port = host, port
        self.url = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.app: Any = None
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL."""
        return f"{self.url}/v1"

    @property
    def state(self) -> ServiceState:
        return self.app[STATE]  # type: ignore[no-any-return]

    @property
    def engine(self) -> AsyncEngine:
        return self.state.engine

    def start(self, wait_ready: bool = True, timeout_s: float = 120.0) -> BackgroundServer:
        """Listen (and, with ``wait_ready``, load the model) within ``timeout_s`` each."""
        self._thread.start()
        if not self._started.wait(timeout_s) or self._error is not None:
            raise RuntimeError(f"the server did not start: {self._error!r}")
        if wait_ready:
            self.run(wait_until_ready(self.app), timeout=timeout_s)
        return self

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as e:  # noqa: BLE001 - reported by start() and stop()
            self._error = e
            self._started.set()
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        engine = self.make_engine() if self.make_engine else None
        self.app = create_app(self.config, engine=engine)
        self.app.middlewares.extend(self.middlewares)
        runner, self.url = await start_site(self.app, self.host, self.port)
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            if self.on_cleanup is not None:
                self.on_cleanup()
            await runner.cleanup()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        """Run ``coro`` on the server loop and return its result (blocking)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 60) -> T:
        """Call ``fn`` on the server loop (engine state is only consistent there)."""
        async def wrapper() -> T:
            return fn()

        return self.run(wrapper(), timeout)

    async def on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the server loop from another event loop."""
        assert self.loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self, timeout_s: float = 120.0) -> None:
        """Shut down (drain, stop the engine: its integrity check runs); re-raises errors."""
        if self.loop is not None and self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError("the server did not stop")
        if self._error is not None:
            raise self._error
