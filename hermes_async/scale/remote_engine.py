"""``RemoteEngine``: the engine API the OpenAI layer uses, over Ray Serve engine replicas.

The ingress serves the same OpenAI layer as the single-process server with this in place of
an ``AsyncEngine``. Prompts are assembled and tokenized here (a :class:`PromptFront` of the
same model: tokenizer, chat template, assembly cache, grammar compiler for validation), so
every call to the engine deployment carries ``(namespace, block digests)`` in its
:class:`~hermes_async.scale.messages.RouteHint` for the prefix-aware router.

- :meth:`submit` streams ``EngineReplica.generate``; the replica's first answer says whether
  it queued the request. A full queue there tries the other replicas (``exclude``) before
  answering :class:`QueueFullError` (429); Ray's own back-pressure (``max_queued_requests``)
  is a 429 too. The outputs are put on a local ``EngineRequest.queue`` as the engine's are;
  ``served_by`` names the replica (the ``X-Hermes-Replica`` header). A replica that dies
  mid-stream ends the request with an error output (the client gets an error event, never a
  hang). :meth:`abort` cancels the stream, which aborts the request on the replica.
- ``/cache/*``, ``/metrics``: fanned out to every replica (``RouteHint.target``) and merged
  (:mod:`~hermes_async.scale.merge`); ``warm`` is routed like a request, so the router learns
  where the warmed prefix lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest

from hermes_async.builder import Front, build_front
from hermes_async.cache.digest import block_hashes
from hermes_async.config import EngineConfig
from hermes_async.engine.async_engine import DEFAULT_NAMESPACE, CacheResetResult, WarmResult
from hermes_async.engine.errors import EngineError, QueueFullError
from hermes_async.engine.front import FrontMethods, PromptFront, check_context_length
from hermes_async.engine.request import (
    CompiledConstraint,
    EngineRequest,
    RequestOutput,
    Usage,
)
from hermes_async.observe.cache_observer import CacheObserver
from hermes_async.prompt import AssembledPrompt
from hermes_async.scale.merge import INGRESS, merge_cache_stats, merge_metrics
from hermes_async.scale.messages import (
    Accepted,
    CallResult,
    Refused,
    ReplicaInfo,
    RouteHint,
)
from hermes_async.types import FinishReason, InvalidParameter, SamplingParams

log = logging.getLogger("hermes_async.scale")


class IngressMetrics:
    """The ingress's own metrics: request errors (the OpenAI layer counts them here, as on
    an engine) and routing decisions by reason."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.request_errors = Counter("hermes_request_errors", "Failed requests by code",
                                      ["code"], registry=self.registry)
        self.routed = Counter("hermes_routed_requests", "Requests routed, by the router's "
                              "reason (prefix, load, spill, pow2) and replica",
                              ["reason", "to"], registry=self.registry)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class _Stream:
    response: Any  # DeploymentResponseGenerator
    task: asyncio.Task[None]


class RemoteEngine(FrontMethods):
    """The engine API over a Ray Serve ``DeploymentHandle`` to :class:`EngineReplica`\\ s.

    ``front_loader``: builds the prompt side (default :func:`build_front` of the configured
    model); ``call_timeout_s``: longest a fan-out call may take per replica.
    """

    def __init__(self, config: EngineConfig, handle: Any, *,
                 front_loader: Callable[[EngineConfig], Front] = build_front,
                 call_timeout_s: float = 10.0) -> None:
        self.config = config
        self.metrics = IngressMetrics()
        self.call_timeout_s = call_timeout_s
        self._handle = handle
        self._front_loader = front_loader
        self._loaded: Front | None = None
        self._info: ReplicaInfo | None = None
        self._streams: dict[str, _Stream] = {}
        self._accepting = False
        self.replicas: tuple[str, ...] = ()
        self.observer: CacheObserver | None = None

    # ----- life cycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the prompt side, then wait for a replica to answer ``info``."""
        if self._loaded is None:
            loaded = await asyncio.to_thread(self._front_loader, self.config)
            self._info = await self._routed_call("info", {})
            tokenizer = loaded.front.tokenizer
            self.observer = CacheObserver(self._info.block_size,
                                          lambda ids: tokenizer.decode(list(ids)))
            loaded.front.on_assembly = self._count_assembly
            self._loaded = loaded
        self._accepting = True
        log.info("ingress ready: replicas %s", ", ".join(self.replicas))

    async def stop(self, drain_timeout_s: float = 0.0) -> None:
        """Stop admitting; in-flight streams get ``drain_timeout_s``, then are aborted."""
        self._accepting = False
        deadline = time.monotonic() + drain_timeout_s
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for rid in list(self._streams):
            self.abort(rid)

    @property
    def is_running(self) -> bool:
        return self._accepting and self._loaded is not None

    def _require_running(self) -> ReplicaInfo:
        if not self.is_running or self._info is None:
            raise EngineError("the engine is not running (starting up or shutting down)")
        return self._info

    # ----- what the engine serves -------------------------------------------------------------
    @property
    def front(self) -> PromptFront:
        if self._loaded is None:
            raise EngineError("the engine is not started")
        return self._loaded.front

    @property
    def model_dir(self) -> Path | None:
        return self._loaded.model_dir if self._loaded is not None else None

    @property
    def max_model_len(self) -> int:
        if self._info is None:
            raise EngineError("the engine is not started")
        return self._info.max_model_len

    @property
    def has_chat_template(self) -> bool:
        return self.front.assembler is not None

    def _count_assembly(self, namespace: str | None, prompt: AssembledPrompt) -> None:
        if self.observer is not None:
            self.observer.on_assembly(namespace or DEFAULT_NAMESPACE, prompt.cache_outcome)

    # ----- requests ---------------------------------------------------------------------------
    def add_request(self, *args: Any, **kwargs: Any) -> EngineRequest:
        raise EngineError("a remote engine queues requests with `await submit(...)`")

    async def submit(self, prompt_ids: list[int], params: SamplingParams | None = None, *,
                     request_id: str | None = None, namespace: str | None = None,
                     grammar: CompiledConstraint | None = None) -> EngineRequest:
        """Queue a request on a replica (see the module docstring); raises as
        ``AsyncEngine.add_request`` does. ``grammar`` is compiled here for validation only:
        the replica compiles ``params.structured`` itself (cached there)."""
        info = self._require_running()
        params = params or SamplingParams()
        check_context_length(len(prompt_ids), params.max_tokens, info.max_model_len)
        rid = request_id or f"req-{uuid.uuid4().hex}"
        if rid in self._streams:
            raise InvalidParameter("request_id", f"request id {rid!r} is already in flight")
        ns = namespace or DEFAULT_NAMESPACE
        hashes = tuple(block_hashes(ns, prompt_ids, info.block_size))
        response, accepted = await self._open(ns, hashes, list(prompt_ids), params, rid)
        req = EngineRequest(rid, ns, list(prompt_ids), params, asyncio.Queue(),
                            served_by=accepted.replica)
        task = asyncio.create_task(self._forward(req, response), name=f"hermes-remote-{rid}")
        self._streams[rid] = _Stream(response, task)
        return req

    async def _open(self, namespace: str, hashes: tuple[bytes, ...], ids: list[int],
                    params: SamplingParams, rid: str) -> tuple[Any, Accepted]:
        """Start ``generate`` on the router's replica, then on the others while they refuse
        with a full queue."""
        from ray.serve.exceptions import BackPressureError

        excluded: set[str] = set()
        while True:
            hint = RouteHint(namespace, hashes, exclude=frozenset(excluded))
            response = self._handle.options(stream=True).generate.remote(hint, ids, params, rid)
            try:
                first = await response.__anext__()
            except BackPressureError as e:
                raise QueueFullError("every replica is at its limit; retry later") from e
            self._note(hint)
            if isinstance(first, Accepted):
                self.metrics.routed.labels(hint.reason or "unknown", first.replica).inc()
                return response, first
            assert isinstance(first, Refused)
            if first.kind != "queue_full":
                raise first.error()
            excluded.add(first.replica)
            if set(hint.replicas) <= excluded:
                raise first.error()

    async def _forward(self, req: EngineRequest, response: Any) -> None:
        """Put the replica's outputs on ``req.queue``; a failed stream ends the request with
        an error output."""
        finished = False
        try:
            async for batch in response:  # to its end: the replica's call completes then
                for out in batch:
                    req.queue.put_nowait(out)
                finished = finished or bool(batch and batch[-1].usage is not None)
            if not finished:
                raise EngineError("the replica ended the stream before the request finished")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the client gets an error event, not a hang
            if finished:
                return
            log.warning("request %s on replica %s failed: %s", req.request_id, req.served_by,
                        e)
            req.queue.put_nowait(RequestOutput(
                req.request_id, 0, "", (), FinishReason.ERROR,
                Usage(len(req.prompt_ids), 0, 0),
                error=f"replica {req.served_by} failed: {type(e).__name__}"))
        finally:
            self._streams.pop(req.request_id, None)

    def abort(self, request_id: str) -> bool:
        """Cancel a request's stream (the replica aborts it); False if not in flight."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return False
        with contextlib.suppress(Exception):
            stream.response.cancel()
        stream.task.cancel()
        return True

    # ----- the prefix cache -------------------------------------------------------------------
    async def warm(self, prompt: str | None = None, *, messages: list[dict] | None = None,
                   token_ids: Sequence[int] | None = None, tools: list[Any] | None = None,
                   namespace: str | None = None,
                   pin_ttl_s: float | None = None) -> WarmResult:
        """``AsyncEngine.warm`` on the replica the router picks for this prompt."""
        info = self._require_running()
        ns = namespace or DEFAULT_NAMESPACE
        ids = await self.prompt_ids(prompt, messages, token_ids, tools=tools, namespace=ns)
        hint = RouteHint(ns, tuple(block_hashes(ns, ids, info.block_size)))
        value = await self._routed_call("warm", {"token_ids": ids, "namespace": ns,
                                                 "pin_ttl_s": pin_ttl_s}, hint)
        return WarmResult(**value)

    async def report_cache_namespaces(self) -> list[str]:
        names = set(self.observer.namespaces() if self.observer else [])
        for value in (await self._fan_out("cache_namespaces", {})).values():
            names.update(value)
        return sorted(names)

    async def report_cache_stats(self, namespaces: Sequence[str] | None = None,
                                 top: int = 10) -> dict[str, Any]:
        """Every replica's ``/cache/stats`` under ``replicas``, summed at the top level."""
        names = None if namespaces is None else list(namespaces)
        docs = await self._fan_out("cache_stats", {"namespaces": names, "top": top})
        assembly = self.observer.assembly_snapshot() if self.observer else {}
        if names is not None and assembly:
            assembly["namespaces"] = {ns: f for ns, f in assembly["namespaces"].items()
                                      if ns in names}
        doc = merge_cache_stats(docs, assembly)
        grammar = self.grammar_stats()
        if grammar is not None:
            doc["grammar"] = grammar
        return doc

    async def clear_cache(self, namespace: str | None = None) -> CacheResetResult:
        """Reset the namespace on every replica (refused where its requests are in flight:
        409, the others are reset)."""
        results = await self._fan_out("reset_cache", {"namespace": namespace},
                                      raise_refusals=False)
        busy = [r for r in results.values() if isinstance(r, Refused)]
        if busy:
            raise busy[0].error()
        return CacheResetResult(namespace, sum(r["freed_blocks"] for r in results.values()),
                                sum(r["unpinned"] for r in results.values()))

    async def report_metrics(self) -> bytes:
        """Every replica's metrics and the ingress's, each sample labelled ``replica``."""
        texts: dict[str, bytes] = {INGRESS: self.metrics.exposition()}
        if self.is_running:
            texts.update(await self._fan_out("metrics", {}))
        return merge_metrics(texts)

    # ----- calls ------------------------------------------------------------------------------
    def _note(self, hint: RouteHint) -> None:
        if hint.replicas:
            self.replicas = hint.replicas

    async def _routed_call(self, method: str, kwargs: dict[str, Any],
                           hint: RouteHint | None = None) -> Any:
        """``EngineReplica.call`` on the replica the router picks."""
        hint = hint or RouteHint()
        result: CallResult = await self._handle.call.remote(hint, method, kwargs)
        self._note(hint)
        if result.refused is not None:
            raise result.refused.error()
        return result.value

    async def _fan_out(self, method: str, kwargs: dict[str, Any], *,
                       raise_refusals: bool = True) -> dict[str, Any]:
        """``EngineReplica.call`` on every replica (``replica -> value``; a refusal raises,
        or is the value when not ``raise_refusals``). A replica that does not answer within
        ``call_timeout_s``, or whose call went elsewhere (it died), is left out.

        Sequential, not gathered: Ray Serve (2.60) gives every call made while serving one
        HTTP request that request's internal id, and its router matches a routed replica to
        the pending call by that id, so concurrent calls from one request can wait forever.
        """
        await self._routed_call("info", {})  # refreshes the replica list
        out: dict[str, Any] = {}
        for name in self.replicas:  # one at a time: see the note below
            call = self._handle.call.remote(RouteHint(target=name), method, kwargs)
            try:
                answer: CallResult = await asyncio.wait_for(call, self.call_timeout_s)
            except Exception as e:  # noqa: BLE001 - a replica that is gone or stuck
                log.warning("replica %s did not answer %s: %r", name, method, e)
                continue
            if answer.replica != name:
                continue  # the target is gone; another replica answered
            if answer.refused is not None:
                if raise_refusals:
                    raise answer.refused.error()
                out[name] = answer.refused
                continue
            out[name] = answer.value
        return out

