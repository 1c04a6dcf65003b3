"""Ray Serve request routers for the engine deployment (``ray.serve.request_router``).

:class:`PrefixAwareRouter` ranks the replicas for each call by
:func:`~hermes_async.scale.prefix_index.rank_replicas`: the replica whose shadowed cache holds
the longest prefix of the prompt's block digests (same namespace only: tenants never match
each other), unless its load (calls this router has in flight there) exceeds the least loaded
replica's by more than ``margin``; then the least loaded. It returns that replica as the first
rank and the others by load as the second, so Ray's own admission (``max_ongoing_requests``
per replica) spills a call to the next replica when the preferred one is saturated.
:meth:`~PrefixAwareRouter.on_request_routed` records the digests under the replica that got
the call; every ranking first applies the replicas' routing stats
(:class:`~hermes_async.scale.prefix_index.ReplicaReport`: restarts, resets, evictions) and
forgets replicas that are gone. Nothing here blocks: the index is in memory.

:class:`Pow2Router` is Ray's default power-of-two-choices router, for comparisons.

Both honour the :class:`~hermes_async.scale.messages.RouteHint` of a call: ``target`` (a
fan-out call goes to that replica only; to any when it is gone, and the answer names who ran
it), ``exclude`` (replicas that refused it already), and they fill in ``replicas`` (every
replica's name), ``routed_to``, ``reason`` and ``matched_blocks``.
"""

from __future__ import annotations

import random
from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)

from hermes_async.scale.messages import RouteHint
from hermes_async.scale.prefix_index import ReplicaReport, ShadowIndex, rank_replicas


def hint_of(request: PendingRequest | None) -> RouteHint | None:
    """The call's :class:`RouteHint` (its first argument), if it has one."""
    if request is None or not request.args:
        return None
    first = request.args[0]
    return first if isinstance(first, RouteHint) else None


def name_of(replica: RunningReplica) -> str:
    return str(replica.replica_id.unique_id)


def backoff_between_tries(request: PendingRequest | None) -> None:
    """Ray retries a ranking none of whose replicas can take the call (all at
    ``max_ongoing_requests``, or their queue lengths unknown) at once, in a loop that never
    yields, unless the request says to back off: ours always does (we rank every replica in
    one try; there is no narrower first stage to fall back from)."""
    if request is not None:
        request.routing_context.should_backoff = True


def targeted(hint: RouteHint, by_name: dict[str, RunningReplica]) -> list[list[RunningReplica]]:
    """The ranking of a fan-out call: its target alone, or every replica when it is gone."""
    assert hint.target is not None
    if hint.target in by_name:
        return [[by_name[hint.target]]]
    return [list(by_name.values())]


class InFlightMixin:
    """Calls this router has in flight per replica (routed, not completed yet), fed to Ray's
    queue-length cache so that a replica is not probed before each call: the probes (an
    actor call with a 0.1-1 s deadline each) time out on a loaded machine and the call waits
    in backoff. Replicas still reject calls past ``max_ongoing_requests`` (Ray's rejection
    protocol), so a count that lags the truth costs a retry, never an overload."""

    def init_in_flight(self) -> None:
        self.in_flight: dict[str, int] = {}
        # internal request id -> (replica name -> calls): the calls an ingress makes while
        # serving one HTTP request all carry that request's internal id
        self.routed: dict[str, dict[str, int]] = {}

    def note_routed(self, request: PendingRequest, name: str) -> None:
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        calls = self.routed.setdefault(request.metadata.internal_request_id, {})
        calls[name] = calls.get(name, 0) + 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.release(internal_request_id, str(replica_id.unique_id))

    def unnote_routed(self, request: PendingRequest, name: str) -> None:
        self.release(request.metadata.internal_request_id, name)

    def release(self, internal_request_id: str, name: str) -> None:
        calls = self.routed.get(internal_request_id)
        if not calls or not calls.get(name):
            return
        calls[name] -= 1
        if not calls[name]:
            del calls[name]
        if not calls:
            del self.routed[internal_request_id]
        if self.in_flight.get(name, 0) > 0:
            self.in_flight[name] -= 1

    def seed_queue_lens(self, replicas: list[RunningReplica]) -> None:
        cache = self.replica_queue_len_cache  # type: ignore[attr-defined]
        for r in replicas:
            if cache.get(r.replica_id) is None:
                cache.update(r.replica_id, self.in_flight.get(name_of(r), 0))


class PrefixAwareRouter(InFlightMixin, RequestRouter):
    """Longest cached prefix first, within a load margin; see the module docstring.

    ``request_router_kwargs``: ``margin`` (calls in flight over the least loaded replica the
    preferred one may have), ``min_matched_fraction`` (the least share of a prompt's blocks a
    cached prefix must cover to attract it), ``max_blocks`` (shadowed digests per replica and
    namespace).
    """

    def initialize_state(self, margin: int = 8, max_blocks: int = 200_000,
                         min_matched_fraction: float = 0.25, **_: Any) -> None:
        self.margin = margin
        self.min_matched_fraction = min_matched_fraction
        self.index = ShadowIndex(max_blocks)
        self.init_in_flight()
        self.reports: dict[str, object] = {}

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None,
                              ) -> list[list[RunningReplica]]:
        backoff_between_tries(pending_request)
        self.seed_queue_lens(candidate_replicas)
        by_name = {name_of(r): r for r in candidate_replicas}
        self._refresh(candidate_replicas)
        hint = hint_of(pending_request)
        if hint is not None:
            hint.replicas = tuple(sorted(by_name))
            if hint.target is not None:
                hint.reason = "target"
                return targeted(hint, by_name)
        names = [n for n in by_name if hint is None or n not in hint.exclude] or list(by_name)
        loads = {n: self.in_flight.get(n, 0) for n in names}
        if hint is None or not hint.hashes:
            ranking = sorted(names, key=lambda n: (loads[n], n))
            return [[by_name[n] for n in ranking]]
        choice = rank_replicas(self.index, hint.namespace, hint.hashes, loads, self.margin,
                               self.min_matched_fraction)
        hint.reason, hint.matched_blocks = choice.reason, choice.matched_blocks
        first, rest = choice.ranking[0], choice.ranking[1:]
        if hint.routed_to is None and pending_request is not None:
            # counted now, not once Ray has sent it: calls chosen meanwhile see this one
            self.index.record(first, hint.namespace, hint.hashes)
            self.note_routed(pending_request, first)
            hint.routed_to = first
        return [[by_name[first]], [by_name[n] for n in rest]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: ReplicaResult) -> None:
        name = str(replica_id.unique_id)
        hint = hint_of(pending_request)
        counted = hint is not None and hint.hashes and hint.target is None
        if counted and hint.routed_to == name:
            return  # as chosen: counted in choose_replicas
        if counted and hint.routed_to is not None:  # Ray sent it elsewhere (first was full)
            self.unnote_routed(pending_request, hint.routed_to)
        if counted:
            self.index.record(name, hint.namespace, hint.hashes)
        if hint is not None:
            hint.routed_to = name
        self.note_routed(pending_request, name)

    def _refresh(self, replicas: list[RunningReplica]) -> None:
        """Forget replicas that are gone; apply each replica's newest routing stats."""
        alive = {name_of(r) for r in replicas}
        for name in set(self.index.replicas()) - alive:
            self.index.forget(name)
            self.in_flight.pop(name, None)
            self.reports.pop(name, None)
        for r in replicas:
            stats = r.routing_stats
            name = name_of(r)
            if not stats or self.reports.get(name) is stats:
                continue
            self.reports[name] = stats
            report = ReplicaReport.from_dict(stats)
            if report is not None:
                self.index.correct(name, report)


class Pow2Router(InFlightMixin, PowerOfTwoChoicesRequestRouter):
    """Ray's default router (power of two choices), honouring fan-out targets and filling in
    the hint's ``replicas`` and ``routed_to``."""

    def initialize_state(self, **_: Any) -> None:
        self.init_in_flight()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None,
                              ) -> list[list[RunningReplica]]:
        self.seed_queue_lens(candidate_replicas)
        hint = hint_of(pending_request)
        if hint is not None:
            backoff_between_tries(pending_request)
            by_name = {name_of(r): r for r in candidate_replicas}
            hint.replicas = tuple(sorted(by_name))
            if hint.target is not None:
                hint.reason = "target"
                return targeted(hint, by_name)
            hint.reason = "pow2"
            kept = [r for n, r in by_name.items() if n not in hint.exclude]
            if hint.exclude and kept:  # two random choices among the rest
                return [random.sample(kept, min(2, len(kept)))]
        return await super().choose_replicas(candidate_replicas, pending_request)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: ReplicaResult) -> None:
        hint = hint_of(pending_request)
        if hint is not None:
            hint.routed_to = str(replica_id.unique_id)
        self.note_routed(pending_request, str(replica_id.unique_id))
