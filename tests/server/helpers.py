"""Servers for the HTTP tests: the real app on 127.0.0.1 with a free port, in a background
thread with its own event loop, so sync clients (``openai.OpenAI``) and async clients on the
test's own loop both talk to it over TCP, and engine state is read on the server's loop.

- ``ServerThread(config, make_engine)``: start, run/call on its loop, stop.
- ``real_config(...)``: the default model (float32, CPU, a 256 MiB KV pool) plus overrides.
- ``post_json`` / ``get``: plain blocking HTTP (urllib) for status, headers and raw bodies.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from hermes_async.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
)
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.openai import ServiceState
from hermes_async.server import STATE, create_app, start_site, wait_until_ready

T = TypeVar("T")


class ServerThread:
    """``create_app(config, engine=make_engine())`` served from a background thread."""

    def __init__(self, config: EngineConfig,
                 make_engine: Callable[[], AsyncEngine] | None = None) -> None:
        self.config = config
        self.make_engine = make_engine
        self.url = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.app: Any = None
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-server", daemon=True)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL."""
        return f"{self.url}/v1"

    @property
    def state(self) -> ServiceState:
        return self.app[STATE]

    @property
    def engine(self) -> AsyncEngine:
        return self.state.engine

    def start(self, wait_ready: bool = True) -> ServerThread:
        self._thread.start()
        if not self._started.wait(60) or self._error is not None:
            raise RuntimeError(f"the test server did not start: {self._error!r}")
        if wait_ready:
            self.run(wait_until_ready(self.app), timeout=120)
        return self

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self._error = e
            self._started.set()
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        engine = self.make_engine() if self.make_engine else None
        self.app = create_app(self.config, engine=engine)
        runner, self.url = await start_site(self.app, "127.0.0.1", 0)
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        """Run a coroutine on the server's loop and return its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 60) -> T:
        """Call ``fn`` on the server's loop (engine state is only consistent there)."""
        async def wrapper() -> T:
            return fn()

        return self.run(wrapper(), timeout)

    def stop(self) -> None:
        """Shut down (drain, stop the engine: its integrity check runs); re-raises errors."""
        if self.loop is not None and self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        assert not self._thread.is_alive(), "the test server did not stop"
        if self._error is not None:
            raise self._error


def real_config(model_dir: Path, *, server: dict[str, Any] | None = None,
                scheduler: dict[str, Any] | None = None,
                max_model_len: int | None = None) -> EngineConfig:
    """The default model on the CPU in float32 with a small KV pool, plus overrides."""
    return EngineConfig(
        model=ModelConfig(path=str(model_dir), dtype="float32", device="cpu",
                          max_model_len=max_model_len),
        cache=CacheConfig(kv_cache_bytes=256 << 20),
        scheduler=SchedulerConfig(**(scheduler or {})),
        server=ServerConfig(**(server or {})),
    )


def engine_idle(engine: AsyncEngine) -> dict[str, int]:
    """Requests, running and waiting sequences, referenced ("pinned": by requests or operator
    pins) and private blocks (all 0 when nothing is in flight or pinned). Call on the server
    loop (``ServerThread.call``)."""
    load = engine.load()
    return {"requests": load.requests, "running": load.running, "waiting": load.waiting,
            "pinned": load.blocks.referenced, "private": load.blocks.private}


def request(url: str, body: Any = None, *, method: str | None = None,
            headers: dict[str, str] | None = None,
            raw: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """Blocking HTTP: JSON ``body`` (or ``raw`` bytes); returns status, headers, body bytes
    (error statuses are returned, not raised)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    method = method or ("GET" if data is None else "POST")
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def request_json(url: str, body: Any = None, **kwargs: Any) -> tuple[int, dict[str, str], Any]:
    """:func:`request` with the body decoded as JSON."""
    status, headers, data = request(url, body, **kwargs)
    return status, headers, json.loads(data)
