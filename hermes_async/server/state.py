"""Typed application and request state (``web.AppKey`` / ``web.RequestKey``), no globals."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from hermes_async.config import EngineConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.server.auth import Authenticator, CacheScope
from hermes_async.server.errors import APIError, unavailable


@dataclass
class ServerState:
    """What the handlers share: the config, the engine and its life cycle, the key table.

    ``start_task`` runs ``engine.start()`` (model loading) in the background, so the server
    listens (and answers ``/health`` with 503) while the model loads.
    """

    config: EngineConfig
    engine: AsyncEngine
    auth: Authenticator
    created: int = field(default_factory=lambda: int(time.time()))
    start_task: asyncio.Task[None] | None = None
    stopping: bool = False

    @property
    def retry_after_s(self) -> int:
        return self.config.server.retry_after_s

    @property
    def model_name(self) -> str:
        """The served model id: ``server.served_model_name``, else the model directory's name."""
        if self.config.server.served_model_name:
            return self.config.server.served_model_name
        model_dir = self.engine.model_dir or self.config.model.path
        return Path(model_dir).name if model_dir else "default"

    def load_error(self) -> BaseException | None:
        """The exception that ended model loading, if it failed."""
        task = self.start_task
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    def engine_or_503(self) -> AsyncEngine:
        """The running engine; 503 while loading, after a failed load or when shutting down."""
        if self.stopping:
            raise unavailable("the server is shutting down", "shutting_down")
        if self.engine.is_running:
            return self.engine
        if (err := self.load_error()) is not None:
            raise unavailable(f"the model failed to load: {err}", "model_load_failed")
        if self.start_task is not None and not self.start_task.done():
            raise unavailable("the model is loading; retry shortly", "model_loading",
                              self.retry_after_s)
        raise unavailable("the engine is not running (shutting down)", "shutting_down")

    def check_model(self, requested: str | None) -> None:
        """404 ``model_not_found`` unless ``requested`` is absent or the served model."""
        if requested is not None and requested != self.model_name:
            raise APIError(404, f"The model `{requested}` does not exist. This server serves "
                           f"`{self.model_name}`.", param="model", code="model_not_found")


STATE = web.AppKey("hermes_state", ServerState)
TENANT = web.RequestKey("hermes_tenant", str)
CACHE_SCOPE = web.RequestKey("hermes_cache_scope", CacheScope)
