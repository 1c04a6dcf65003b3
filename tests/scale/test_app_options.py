"""The Ray Serve application's options from the ``[ray]`` config (no cluster started)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="the ray extra (make test installs it)")

from hermes_async.config import ConfigError, EngineConfig, RayConfig  # noqa: E402
from hermes_async.scale.app import (  # noqa: E402
    engine_options,
    local_cpus,
    replica_pools,
)
from hermes_async.scale.replica import replica_config  # noqa: E402
from hermes_async.scale.router import Pow2Router, PrefixAwareRouter  # noqa: E402


def test_fixed_replicas_with_the_prefix_router() -> None:
    cfg = EngineConfig().replace(ray={"replicas": 3, "num_cpus_per_replica": 2.0,
                                      "router_margin": 5, "max_ongoing_requests": 64})
    opts = engine_options(cfg)
    assert opts["num_replicas"] == 3 and "autoscaling_config" not in opts
    assert opts["ray_actor_options"] == {"num_cpus": 2.0}
    assert opts["max_ongoing_requests"] == 64
    assert opts["max_queued_requests"] == cfg.scheduler.max_waiting
    router = opts["request_router_config"]
    assert router.request_router_kwargs == {"margin": 5, "min_matched_fraction": 0.25}
    assert "PrefixAwareRouter" in str(router.request_router_class) or \
        router.request_router_class is PrefixAwareRouter
    assert replica_config(cfg).model.num_threads == 2  # threads follow the CPU share


def test_autoscaling_gpus_and_the_pow2_router() -> None:
    cfg = EngineConfig().replace(ray={
        "replicas": 2, "autoscale_min_replicas": 1, "autoscale_max_replicas": 4,
        "target_ongoing_requests": 16, "num_gpus_per_replica": 1.0, "router": "pow2"})
    opts = engine_options(cfg)
    assert "num_replicas" not in opts
    assert opts["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4,
                                          "initial_replicas": 2, "target_ongoing_requests": 16}
    assert opts["ray_actor_options"]["num_gpus"] == 1.0
    router = opts["request_router_config"]
    assert router.request_router_kwargs == {}
    assert "Pow2Router" in str(router.request_router_class) or \
        router.request_router_class is Pow2Router
    # four replicas at most: each pool a quarter of the default share; enough logical CPUs
    assert replica_pools(cfg).cache.kv_cache_memory_fraction == pytest.approx(0.25 / 4)
    assert local_cpus(cfg) >= 5


def test_invalid_ray_sections_are_refused() -> None:
    for bad in ({"replicas": 0}, {"router": "random"}, {"autoscale_min_replicas": 1},
                {"autoscale_min_replicas": 3, "autoscale_max_replicas": 4, "replicas": 2},
                {"router_min_matched_fraction": 1.5}, {"routing_stats_period_s": 0}):
        with pytest.raises(ConfigError):
            RayConfig(**bad)
