"""``EngineReplica``: one engine (its own KV pool) as a Ray Serve deployment replica.

:func:`~hermes_async.scale.app.build_app` wraps it with ``serve.deployment``. Its methods are
what the ingress's :class:`~hermes_async.scale.remote_engine.RemoteEngine` calls, each with a
:class:`~hermes_async.scale.messages.RouteHint` first (the router reads it; the replica
ignores it):

- :meth:`generate` (streaming): ``Accepted`` or ``Refused`` first, then lists of the
  request's ``RequestOutput``\\ s as they come (one list per wake-up: fewer, larger Ray
  messages). Cancelling the call (the client went away) aborts the engine request.
- :meth:`call`: ``info``, ``cache_namespaces``, ``cache_stats``, ``reset_cache``, ``warm``,
  ``metrics``, ``load``; answers a :class:`~hermes_async.scale.messages.CallResult` naming
  this replica.

Ray calls :meth:`record_routing_stats` every ``ray.routing_stats_period_s`` (the router's
shadow index corrections), :meth:`check_health` every ``ray.health_check_period_s`` (the
engine loop alive, the cache's invariants: a failure restarts the replica) and ``__del__``
on shutdown or downscale (in-flight requests get ``server.shutdown_drain_s`` to finish).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from hermes_async.config import EngineConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.engine.request import RequestOutput
from hermes_async.scale.messages import (
    Accepted,
    CallResult,
    Refused,
    ReplicaInfo,
    RouteHint,
    RoutingStats,
)
from hermes_async.types import SamplingParams

log = logging.getLogger("hermes_async.scale")

EngineFactory = Callable[[EngineConfig], AsyncEngine]


def load_factory(path: str | None) -> EngineFactory:
    """The engine factory ``"module:attribute"`` (None: ``hermes_async.AsyncEngine``, which
    loads the configured model)."""
    if path is None:
        from hermes_async.builder import AsyncEngine as DefaultEngine

        return DefaultEngine
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def replica_config(config: EngineConfig) -> EngineConfig:
    """``config`` for one replica: torch threads follow ``ray.num_cpus_per_replica`` unless
    ``model.num_threads`` is set."""
    if config.model.num_threads is not None:
        return config
    threads = max(1, int(config.ray.num_cpus_per_replica))
    return config.replace(model={"num_threads": threads})


def replica_name() -> str:
    """This replica's Ray Serve id (the router's name for it)."""
    from ray import serve

    return str(serve.get_replica_context().replica_id.unique_id)


class EngineReplica:
    """One engine behind Ray Serve; see the module docstring."""

    async def __init__(self, config: EngineConfig, engine_factory: str | None = None) -> None:
        self.config = replica_config(config)
        self.name = replica_name()
        self.engine = load_factory(engine_factory)(self.config)
        await self.engine.start()
        self.started_at = time.time()
        self.resets: dict[str, int] = {}
        log.info("engine replica %s ready (max_model_len %d)", self.name,
                 self.engine.max_model_len)

    # ----- generation -------------------------------------------------------------------------
    async def generate(self, hint: RouteHint, token_ids: list[int], params: SamplingParams,
                       request_id: str) -> AsyncIterator[Accepted | Refused | list[RequestOutput]]:
        """Run one request; see the module docstring."""
        engine = self.engine
        try:
            grammar = (await engine.compile_grammar(params.structured)
                       if params.structured is not None else None)
            req = engine.add_request(token_ids, params, request_id=request_id,
                                     namespace=hint.namespace or None, grammar=grammar)
        except Exception as e:  # noqa: BLE001 - answered as a refusal, the request not queued
            yield Refused.of(self.name, e)
            return
        done = False
        try:
            yield Accepted(self.name)
            while not done:
                batch = [await req.queue.get()]
                while not req.queue.empty():
                    batch.append(req.queue.get_nowait())
                done = batch[-1].usage is not None
                yield batch
        finally:
            if not done:
                engine.abort(request_id)

    # ----- everything else --------------------------------------------------------------------
    async def call(self, hint: RouteHint, method: str, kwargs: dict[str, Any]) -> CallResult:
        """One of the fan-out or routed methods (see the module docstring)."""
        try:
            value = await self._call(method, kwargs)
        except Exception as e:  # noqa: BLE001 - the ingress rebuilds the error
            return CallResult(self.name, refused=Refused.of(self.name, e))
        return CallResult(self.name, value)

    async def _call(self, method: str, kwargs: dict[str, Any]) -> object:
        engine = self.engine
        if method == "info":
            return ReplicaInfo(self.name, engine.max_model_len, engine.runner.block_size,
                               str(engine.model_dir) if engine.model_dir else None,
                               self.started_at)
        if method == "cache_namespaces":
            return await engine.report_cache_namespaces()
        if method == "cache_stats":
            return await engine.report_cache_stats(kwargs.get("namespaces"),
                                                   top=kwargs.get("top", 10))
        if method == "reset_cache":
            namespace = kwargs.get("namespace")
            touched = [namespace] if namespace is not None else \
                sorted(set(self.resets) | set(engine.cached_blocks()))
            result = await engine.clear_cache(namespace)
            for ns in touched:  # the router drops its shadow of these namespaces
                self.resets[ns] = self.resets.get(ns, 0) + 1
            return dataclasses.asdict(result)
        if method == "warm":
            result = await engine.warm(**kwargs)
            return dataclasses.asdict(result)
        if method == "metrics":
            return await engine.report_metrics()
        if method == "load":
            return dataclasses.asdict(engine.load())
        raise ValueError(f"unknown replica method {method!r}")

    # ----- what Ray Serve calls ---------------------------------------------------------------
    def record_routing_stats(self) -> dict[str, object]:
        """This replica's cache as the router's shadow index needs it (cached blocks per
        namespace, reset counters, restart time) and its queues."""
        load = self.engine.load()
        return RoutingStats(self.started_at, self.engine.cached_blocks(), dict(self.resets),
                            load.running, load.waiting).as_dict()

    def check_health(self) -> None:
        """Raise (Ray restarts the replica) unless the engine loop runs and the cache's
        invariants hold."""
        if not self.engine.is_running:
            raise RuntimeError(f"replica {self.name}: the engine loop is not running")
        self.engine.check_integrity()

    async def __del__(self) -> None:
        """Drain (``server.shutdown_drain_s``) and stop the engine."""
        await self.engine.stop(drain_timeout_s=self.config.server.shutdown_drain_s)
