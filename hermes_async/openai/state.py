"""What the services share (:class:`ServiceState`, one per front end) and what each call
carries (:class:`RequestContext`: that state plus the :class:`~hermes_async.openai.auth.Caller`).

``ServiceState`` owns the engine's life cycle as a server sees it: :meth:`ServiceState.start`
runs ``engine.start()`` (model loading) in the background, so a front end can listen at once
and answer 503 while the model loads; :meth:`ServiceState.begin_shutdown` makes new requests
503; :meth:`ServiceState.stop` lets in-flight ones drain for ``server.shutdown_drain_s`` and
stops the engine. No globals: several states (engines) can live in one process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from hermes_async.config import EngineConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.openai.auth import Authenticator, CacheScope, Caller, namespace_for
from hermes_async.openai.errors import APIError, unavailable

log = logging.getLogger("hermes_async.openai")


@dataclass
class ServiceState:
    """The config, the engine and its life cycle, the key table; see the module docstring."""

    config: EngineConfig
    engine: AsyncEngine
    auth: Authenticator
    created: int = field(default_factory=lambda: int(time.time()))
    start_task: asyncio.Task[None] | None = None
    stopping: bool = False

    @classmethod
    def of(cls, config: EngineConfig, engine: AsyncEngine) -> ServiceState:
        """The state of ``engine`` with the keys of ``config.server``."""
        return cls(config, engine, Authenticator(config.server.api_keys,
                                                 config.server.admin_key))

    # ----- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine (model loading) in a background task; call on the serving loop."""
        self.start_task = asyncio.create_task(self.engine.start(), name="hermes-engine-start")
        self.start_task.add_done_callback(_log_start)

    def begin_shutdown(self) -> None:
        """From now on new requests get 503 ``shutting_down``; in-flight ones go on."""
        self.stopping = True

    async def stop(self) -> None:
        """Stop admitting, wait for the start (never leave a half-loaded engine behind), then
        stop the engine with ``server.shutdown_drain_s`` for in-flight requests."""
        self.stopping = True
        if self.start_task is not None:
            await asyncio.wait([self.start_task])
        await self.engine.stop(drain_timeout_s=self.config.server.shutdown_drain_s)

    async def wait_until_ready(self) -> None:
        """Wait for the engine's start (model loading); re-raises a failed load."""
        if self.start_task is None:
            raise RuntimeError("the engine is not started (ServiceState.start)")
        await asyncio.shield(self.start_task)

    def load_error(self) -> BaseException | None:
        """The exception that ended model loading, if it failed."""
        task = self.start_task
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    # ----- what requests check ----------------------------------------------------------------
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


def _log_start(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the engine failed to start: %s", task.exception())


@dataclass(frozen=True)
class RequestContext:
    """One call's context: the shared state and who is calling."""

    state: ServiceState
    caller: Caller = field(default_factory=Caller)

    def namespace(self, cache_salt: str | None = None) -> str:
        """The caller's prefix-cache namespace (split by ``cache_salt``)."""
        return namespace_for(self.caller.tenant, cache_salt)

    @property
    def scope(self) -> CacheScope:
        """The caller's cache scope (``/cache/*`` services); a front end that did not resolve
        one is a programming error, never an open door."""
        if self.caller.scope is None:
            raise RuntimeError("no cache scope resolved for this caller (resolve_caller)")
        return self.caller.scope
