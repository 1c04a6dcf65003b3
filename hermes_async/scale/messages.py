"""What the ingress, the router and the engine replicas say to each other (plain data, no Ray).

Every call from the ingress to the engine deployment carries a :class:`RouteHint` as its
first argument. The router (same process as the ingress) reads it -- the namespace and block
digests to match, a target replica for fan-out calls, replicas to skip -- and writes back
where it sent the call and why (``replicas``, ``routed_to``, ``reason``, ``matched_blocks``):
the hint is the very object the ingress holds until Ray serializes the call.

A replica answers a generation first with :class:`Accepted` (its name: the
``X-Hermes-Replica`` header) or :class:`Refused` (queue full, invalid, not running), then
batches of ``RequestOutput``. Refusals travel as data (kind, message, param, code), not as
pickled exceptions, and :meth:`Refused.error` rebuilds the engine's exception.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hermes_async.engine.errors import EngineError, NamespaceBusyError, QueueFullError
from hermes_async.types import InvalidParameter


@dataclass
class RouteHint:
    """Routing input (set by the ingress) and outcome (set by the router); see the module
    docstring. ``hashes``: :func:`~hermes_async.cache.digest.block_hashes` of the
    prompt; empty for calls that do not touch the cache. ``target``: a replica name the call
    must go to (fan-out); ``exclude``: replicas that refused it already."""

    namespace: str = ""
    hashes: tuple[bytes, ...] = ()
    target: str | None = None
    exclude: frozenset[str] = frozenset()
    replicas: tuple[str, ...] = ()
    routed_to: str | None = None
    reason: str = ""
    matched_blocks: int = 0


@dataclass(frozen=True)
class Accepted:
    """The replica queued the request; its outputs follow."""

    replica: str


@dataclass(frozen=True)
class Refused:
    """The replica did not queue the request: ``kind`` ``queue_full``, ``invalid`` (an
    :class:`InvalidParameter`) or ``engine`` (not running, shutting down)."""

    replica: str
    kind: str
    message: str
    param: str | None = None
    code: str | None = None

    @classmethod
    def of(cls, replica: str, exc: Exception) -> Refused:
        if isinstance(exc, QueueFullError):
            return cls(replica, "queue_full", str(exc))
        if isinstance(exc, NamespaceBusyError):
            return cls(replica, "busy", str(exc), ",".join(exc.namespaces))
        if isinstance(exc, InvalidParameter):
            return cls(replica, "invalid", str(exc), exc.param, exc.code)
        return cls(replica, "engine", str(exc))

    def error(self) -> Exception:
        """The engine exception this refusal stands for."""
        if self.kind == "busy":
            return NamespaceBusyError(list(self.param.split(",")) if self.param else [])
        if self.kind == "queue_full":
            return QueueFullError(self.message)
        if self.kind == "invalid":
            return InvalidParameter(self.param or "prompt", self.message, code=self.code)
        return EngineError(f"replica {self.replica}: {self.message}")


@dataclass(frozen=True)
class ReplicaInfo:
    """A replica's answer to ``info``: what the ingress needs to know of the engines."""

    replica: str
    max_model_len: int
    block_size: int
    model_dir: str | None
    started_at: float


@dataclass(frozen=True)
class CallResult:
    """A fan-out call's answer, named by the replica that ran it (a call whose target died
    may have gone to another one)."""

    replica: str
    value: object = None
    refused: Refused | None = None


@dataclass
class RoutingStats:
    """What a replica reports to the router every ``ray.routing_stats_period_s``."""

    started_at: float
    cached_blocks: dict[str, int] = field(default_factory=dict)
    resets: dict[str, int] = field(default_factory=dict)
    running: int = 0
    waiting: int = 0
    taken_at: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, object]:
        return {"started_at": self.started_at, "cached_blocks": self.cached_blocks,
                "resets": self.resets, "running": self.running, "waiting": self.waiting,
                "taken_at": self.taken_at}
