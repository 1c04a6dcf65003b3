"""The Ray Serve application of hermes_async: an ingress plus N engine replicas.

    app = build_app(config)                      # the [ray] section says how many, where
    start_ray(config)                            # ray.init (local, or config.ray.address)
    handle = serve.run(app, name="hermes", route_prefix="/")

:func:`build_app` binds :class:`~hermes_async.scale.ingress.Ingress` (``ingress_num_cpus``)
to :class:`~hermes_async.scale.replica.EngineReplica` deployed ``ray.replicas`` times (or
autoscaled between ``autoscale_min_replicas`` and ``autoscale_max_replicas``), each with
``num_cpus_per_replica`` / ``num_gpus_per_replica``, ``max_ongoing_requests``, health checks
every ``health_check_period_s``, a graceful shutdown of ``server.shutdown_drain_s`` and the
router of ``ray.router``. :func:`serve_forever` is what ``hermes-async serve --replicas N``
runs: listen on ``server.host:port`` through Ray Serve's proxy until SIGINT/SIGTERM, then
``serve.shutdown`` and ``ray.shutdown`` (no processes or ports left behind).
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import threading
from typing import Any

import ray
from ray import serve
from ray.serve.config import HTTPOptions, RequestRouterConfig

from hermes_async.config import EngineConfig, RayConfig
from hermes_async.scale.ingress import Ingress
from hermes_async.scale.replica import EngineReplica
from hermes_async.scale.router import Pow2Router, PrefixAwareRouter

APP_NAME = "hermes"
ENGINE_DEPLOYMENT = "engine"
INGRESS_DEPLOYMENT = "ingress"
ROUTERS: dict[str, type] = {"prefix": PrefixAwareRouter, "pow2": Pow2Router}


def engine_options(config: EngineConfig) -> dict[str, Any]:
    """``serve.deployment`` options of the engine replicas."""
    rc = config.ray
    actor: dict[str, Any] = {"num_cpus": rc.num_cpus_per_replica}
    if rc.num_gpus_per_replica:
        actor["num_gpus"] = rc.num_gpus_per_replica
    options: dict[str, Any] = {
        "name": ENGINE_DEPLOYMENT,
        "ray_actor_options": actor,
        "max_ongoing_requests": rc.max_ongoing_requests,
        "max_queued_requests": config.scheduler.max_waiting,
        "health_check_period_s": rc.health_check_period_s,
        "graceful_shutdown_timeout_s": config.server.shutdown_drain_s + 5.0,
        "request_router_config": RequestRouterConfig(
            request_router_class=ROUTERS[rc.router],
            request_router_kwargs={
                "margin": rc.router_margin,
                "min_matched_fraction": rc.router_min_matched_fraction,
            } if rc.router == "prefix" else {},
            request_routing_stats_period_s=rc.routing_stats_period_s),
    }
    if rc.autoscaling:
        options["autoscaling_config"] = {
            "min_replicas": rc.autoscale_min_replicas, "max_replicas": rc.autoscale_max_replicas,
            "initial_replicas": rc.replicas,
            "target_ongoing_requests": rc.target_ongoing_requests}
    else:
        options["num_replicas"] = rc.replicas
    return options


def replica_pools(config: EngineConfig) -> EngineConfig:
    """Without ``cache.kv_cache_bytes``, each replica's KV pool takes
    ``kv_cache_memory_fraction / replicas`` (the most replicas, with autoscaling) of the memory
    free when it starts, so that N replicas on one machine share what one engine would take."""
    if config.cache.kv_cache_bytes is not None:
        return config
    most = max(config.ray.replicas, config.ray.autoscale_max_replicas or 0)
    return config.replace(cache={
        "kv_cache_memory_fraction": config.cache.kv_cache_memory_fraction / most})


def build_app(config: EngineConfig, engine_factory: str | None = None) -> Any:
    """The bound application (``serve.run`` it). ``engine_factory``: ``"module:callable"``
    building each replica's engine from its config (default: the configured model)."""
    engine = serve.deployment(EngineReplica, **engine_options(config))
    # the deployments' own arguments leave out what is a deployment option (replica counts,
    # autoscaling, router): changing those is then an in-place update (scale up or down,
    # draining the replicas that go), not a redeployment of every replica
    args = dataclasses.replace(
        replica_pools(config),
        ray=RayConfig(num_cpus_per_replica=config.ray.num_cpus_per_replica))
    ingress = serve.deployment(Ingress, name=INGRESS_DEPLOYMENT,
                               ray_actor_options={"num_cpus": config.ray.ingress_num_cpus},
                               max_ongoing_requests=max(1000, config.ray.max_ongoing_requests),
                               graceful_shutdown_timeout_s=config.server.shutdown_drain_s + 5.0)
    return ingress.bind(args, engine.bind(args, engine_factory))


def local_cpus(config: EngineConfig) -> int:
    """Logical CPUs of a local cluster: the machine's, or what the deployments reserve when
    that is more (two 1-CPU replicas and the ingress on a 2-core machine share its cores, as
    a single server's threads would)."""
    rc = config.ray
    wanted = math.ceil(max(rc.replicas, rc.autoscale_max_replicas or 0) * rc.num_cpus_per_replica
                       + rc.ingress_num_cpus)
    return max(os.cpu_count() or 1, wanted)


def start_ray(config: EngineConfig, **init_kwargs: Any) -> None:
    """Join ``ray.address`` or start a local Ray (no dashboard; :func:`local_cpus` CPUs
    unless ``num_cpus`` is given), then Serve's HTTP proxy on ``server.host:port``."""
    if not ray.is_initialized():
        if config.ray.address is None:
            init_kwargs.setdefault("num_cpus", local_cpus(config))
        ray.init(address=config.ray.address, include_dashboard=False, **init_kwargs)
    serve.start(http_options=HTTPOptions(host=config.server.host, port=config.server.port))


def stop_ray() -> None:
    """``serve.shutdown`` then ``ray.shutdown``: the replicas drain and the ports close."""
    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()


def serve_forever(config: EngineConfig, engine_factory: str | None = None) -> int:
    """Run the application until SIGINT/SIGTERM; returns the exit status."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        start_ray(config)
        serve.run(build_app(config, engine_factory), name=APP_NAME, route_prefix="/")
        url = f"http://{config.server.host}:{config.server.port}"
        print(f"hermes-async: ready on Ray Serve: {config.ray.replicas} engine replicas "
              f"(router {config.ray.router}); OpenAI base URL {url}/v1", flush=True)
        stop.wait()
    finally:
        print("hermes-async: shutting down", flush=True)
        stop_ray()
    return 0
