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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from hermes_async.config import EngineConfig
from hermes_async.server.background import BackgroundServer

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


class InProcessServer(BackgroundServer):
    """The real app on 127.0.0.1 (a free port) in a background thread with its own loop."""

    remote = False

    def __init__(self, config: EngineConfig, leak: LeakHook | None = None) -> None:
        super().__init__(config, middlewares=[leak.middleware] if leak else [],
                         on_cleanup=leak.release if leak else None, name="soak-server")
        self.leak = leak

    def start(self, wait_ready: bool = True, timeout_s: float = 300.0) -> InProcessServer:
        super().start(wait_ready, timeout_s)
        return self

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
