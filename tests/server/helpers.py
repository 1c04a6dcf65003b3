"""Servers for the HTTP tests: the real app on 127.0.0.1 with a free port, in a background
thread with its own event loop, so sync clients (``openai.OpenAI``) and async clients on the
test's own loop both talk to it over TCP, and engine state is read on the server's loop.

- ``ServerThread(config, make_engine)``: start, run/call on its loop, stop.
- ``real_config(...)``: the default model (float32, CPU, a 256 MiB KV pool) plus overrides.
- ``post_json`` / ``get``: plain blocking HTTP (urllib) for status, headers and raw bodies.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hermes_async.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
)
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.server.background import BackgroundServer


class ServerThread(BackgroundServer):
    """``create_app(config, engine=make_engine())`` served from a background thread (the
    server tests' name for :class:`~hermes_async.server.background.BackgroundServer`)."""

    def __init__(self, config: EngineConfig,
                 make_engine: Callable[[], AsyncEngine] | None = None) -> None:
        super().__init__(config, make_engine=make_engine, name="test-server")


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
