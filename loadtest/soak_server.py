"""The soak's server side (import as ``from soak_server import ...``): the real app in-process
(a thread with its own event loop on 127.0.0.1, port 0, as the server tests run it), the
``--inject-leak`` hook, and the probes the sampler reads.

- :class:`InProcessServer`: ``create_app(config)`` served from a background thread; its probe
  reads the process (RSS, open fds, threads), the asyncio tasks of the *server's* loop and
  ``engine.load()`` on that loop, where engine state is consistent.
- :class:`RemoteProbe`: the same series for ``--url``: queues and KV blocks from
  ``GET /metrics``, RSS/fds/threads from ``/proc/<pid>`` when ``--pid`` is given; no task
  count and no integrity check (they need the server's loop).
- :class:`LeakHook`: a middleware appended to the app before it starts: after every response
  it keeps the response, ``leak_bytes`` of touched memory and one never-ending task on the
  server loop -- the deliberate leak that a soak must catch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from hermes_async.config import EngineConfig
from hermes_async.server import STATE, create_app, start_site, wait_until_ready

T = TypeVar("T")

try:
    import psutil
except ImportError:  # pragma: no cover - psutil ships with the test extra's locust
    psutil = None


def process_figures(pid: int | None = None) -> dict[str, float]:
    """RSS (MiB), open file descriptors and threads of ``pid`` (default: this process)."""
    pid = pid or os.getpid()
    out: dict[str, float] = {}
    if psutil is not None:
        proc = psutil.Process(pid)
        out["rss_mb"] = proc.memory_info().rss / 2**20
        out["threads"] = proc.num_threads()
    else:
        status = Path(f"/proc/{pid}/status").read_text()
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                out["rss_mb"] = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


class LeakHook:
    """The deliberate leak of ``--inject-leak`` (a test hook of the soak only)."""

    def __init__(self, leak_bytes: int) -> None:
        self.leak_bytes = leak_bytes
        self.kept: list[Any] = []
        self.tasks: list[asyncio.Task] = []

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        try:
            return await handler(request)
        finally:
            # b"\xa5" * n touches every page (a zeroed bytearray would not show in RSS)
            self.kept.append((request.path, b"\xa5" * self.leak_bytes))
            self.tasks.append(asyncio.get_running_loop().create_task(
                asyncio.Event().wait(), name="soak-injected-leak"))

    def release(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.kept.clear()


class InProcessServer:
    """The real app on 127.0.0.1 (a free port) in a background thread with its own loop."""

    remote = False

    def __init__(self, config: EngineConfig, leak: LeakHook | None = None) -> None:
        self.config = config
        self.leak = leak
        self.url = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.app: web.Application | None = None
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="soak-server", daemon=True)

    @property
    def engine(self) -> Any:
        assert self.app is not None
        return self.app[STATE].engine

    def start(self, timeout_s: float = 300.0) -> InProcessServer:
        self._thread.start()
        if not self._started.wait(timeout_s) or self._error is not None:
            raise RuntimeError(f"the server did not start: {self._error!r}")
        assert self.app is not None
        self.run(wait_until_ready(self.app), timeout=timeout_s)
        return self

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as e:  # noqa: BLE001 - reported by start()/stop()
            self._error = e
            self._started.set()
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self.app = create_app(self.config)
        if self.leak is not None:
            self.app.middlewares.append(self.leak.middleware)
        runner, self.url = await start_site(self.app, "127.0.0.1", 0)
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            if self.leak is not None:
                self.leak.release()
            await runner.cleanup()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        """Run ``coro`` on the server loop (blocking)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 60) -> T:
        """Call ``fn`` on the server loop (blocking)."""
        async def wrapper() -> T:
            return fn()
        return self.run(wrapper(), timeout)

    async def on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the server loop from another loop."""
        assert self.loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def _server_figures(self) -> dict[str, float]:
        load = self.engine.load()
        b = load.blocks
        return {"tasks": len(asyncio.all_tasks()), "requests": load.requests,
                "running": load.running, "waiting": load.waiting, "kv_free": b.free,
                "kv_cached": b.cached, "kv_referenced": b.referenced, "kv_private": b.private,
                "kv_total": b.total}

    async def probe(self) -> dict[str, float]:
        """One sample: process figures, the server loop's tasks, queues, KV blocks."""
        figures = await self.on_loop(self._server_figures())
        figures.update(process_figures())
        return figures

    async def check_integrity(self) -> str | None:
        """``engine.check_integrity()`` on the server loop: None, or what failed."""
        async def check() -> None:
            self.engine.check_integrity()
        try:
            await self.on_loop(check())
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            return f"{type(e).__name__}: {e}"
        return None

    def stop(self) -> None:
        """Shut down (drain, stop the engine: its own integrity check runs); re-raises."""
        if self.loop is not None and self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(120)
        if self._thread.is_alive():
            raise RuntimeError("the server did not stop")
        if self._error is not None:
            raise self._error


GAUGES = {"hermes_num_requests_running": "running", "hermes_num_requests_waiting": "waiting",
          "hermes_kv_blocks_total": "kv_total", "hermes_kv_blocks_free": "kv_free",
          "hermes_kv_blocks_cached": "kv_cached", "hermes_kv_blocks_referenced": "kv_referenced"}


def metric_samples(text: str) -> dict[str, float]:
    """Prometheus text -> sample name -> value (summed over label sets)."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name] = samples.get(s.name, 0.0) + s.value
    return samples


class RemoteProbe:
    """The sampler's view of a server at ``--url``: ``/metrics`` gauges, ``/proc/<pid>``."""

    remote = True

    def __init__(self, url: str, pid: int | None, session: aiohttp.ClientSession) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.pid = pid
        self.session = session

    async def probe(self) -> dict[str, float]:
        async with self.session.get(f"{self.url}/metrics") as resp:
            samples = metric_samples(await resp.text())
        out = {name: samples[g] for g, name in GAUGES.items() if g in samples}
        if {"kv_total", "kv_free", "kv_cached", "kv_referenced"} <= set(out):
            out["kv_private"] = (out["kv_total"] - out["kv_free"] - out["kv_cached"]
                                 - out["kv_referenced"])
        if "running" in out and "waiting" in out:
            out["requests"] = out["running"] + out["waiting"]  # sequences, as close as it gets
        if self.pid is not None:
            with contextlib.suppress(OSError):
                out.update(process_figures(self.pid))
        return out

    async def check_integrity(self) -> str | None:
        return None  # needs the server's loop: only in-process
