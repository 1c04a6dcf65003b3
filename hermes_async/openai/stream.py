"""The engine requests behind one API request, read as one stream of outputs.

:class:`EngineStream` queues one engine request per prompt (``n`` sequences each) and yields
``(prompt_index, RequestOutput)`` items, or ``None`` when nothing arrived for the keep-alive
interval (a streamed response sends a comment then). Its :meth:`EngineStream.close` aborts
whatever has not finished: services call it in ``finally`` (and a streamed response's close
hook does), so a client that disconnects or any error releases the KV blocks at once.
:func:`collect` reads a stream to its end for a non-streaming response.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.engine.request import (
    GRAMMAR_REJECTED,
    CompiledConstraint,
    EngineRequest,
    RequestOutput,
    TokenLogprob,
    Usage,
)
from hermes_async.openai.errors import APIError, unavailable
from hermes_async.openai.limits import Deadline
from hermes_async.types import FinishReason, SamplingParams

Item = tuple[int, RequestOutput]


class EngineStream:
    """Outputs of one or more engine requests, merged; see the module docstring."""

    def __init__(self, engine: AsyncEngine, requests: list[EngineRequest], *,
                 keepalive_s: float, deadline: Deadline) -> None:
        self.engine = engine
        self.requests = requests
        self.keepalive_s = keepalive_s
        self.deadline = deadline
        self.usages: list[Usage] = []
        self._pending = set(range(len(requests)))
        self._merged: asyncio.Queue[Item] | None = None
        self._forwarders: list[asyncio.Task[None]] = []

    @classmethod
    async def open(cls, engine: AsyncEngine, prompts: Sequence[Sequence[int]],
             params: SamplingParams, *, request_id: str, namespace: str, keepalive_s: float,
             deadline: Deadline, grammar: CompiledConstraint | None = None) -> EngineStream:
        """Queue one engine request per prompt (ids ``request_id`` or ``request_id-k``); if
        one is refused (queue full, shutting down) the others are aborted and the error
        propagates. ``grammar``: ``params.structured`` compiled (each sequence gets its own
        matcher). Through :meth:`AsyncEngine.submit`, so a remote engine (Ray replicas) can
        refuse a request before the response starts."""
        reqs: list[EngineRequest] = []
        try:
            for k, ids in enumerate(prompts):
                rid = request_id if len(prompts) == 1 else f"{request_id}-{k}"
                reqs.append(await engine.submit(list(ids), params, request_id=rid,
                                                namespace=namespace, grammar=grammar))
        except BaseException:
            for r in reqs:
                engine.abort(r.request_id)
            raise
        return cls(engine, reqs, keepalive_s=keepalive_s, deadline=deadline)

    def headers(self) -> dict[str, str]:
        """Response headers naming where the requests ran (``X-Hermes-Replica`` behind Ray
        Serve; none for a local engine)."""
        served = sorted({r.served_by for r in self.requests if r.served_by})
        return {"X-Hermes-Replica": ",".join(served)} if served else {}

    @property
    def done(self) -> bool:
        """Every request delivered its last output (the one carrying ``usage``)."""
        return not self._pending

    @property
    def usage(self) -> Usage:
        """Token counts summed over the prompts (complete once :attr:`done`)."""
        return Usage(sum(u.prompt_tokens for u in self.usages),
                     sum(u.completion_tokens for u in self.usages),
                     sum(u.cached_tokens for u in self.usages),
                     sum(u.draft_tokens for u in self.usages),
                     sum(u.accepted_draft_tokens for u in self.usages))

    async def next(self) -> Item | None:
        """The next output, or ``None`` after ``keepalive_s`` without one; raises the 504
        :class:`APIError` once the deadline has passed."""
        timeout = self.keepalive_s
        remaining = self.deadline.remaining()
        if remaining is not None:
            if remaining <= 0:
                raise self.deadline.error()
            timeout = min(timeout, remaining)
        try:
            async with asyncio.timeout(timeout):
                item = await self._get()
        except TimeoutError:
            if self.deadline.remaining() == 0:
                raise self.deadline.error() from None
            return None
        k, out = item
        if out.usage is not None:
            self._pending.discard(k)
            self.usages.append(out.usage)
        return item

    async def _get(self) -> Item:
        if len(self.requests) == 1:
            return 0, await self.requests[0].queue.get()
        if self._merged is None:
            self._merged = asyncio.Queue()
            self._forwarders = [asyncio.create_task(self._forward(k, r))
                                for k, r in enumerate(self.requests)]
        return await self._merged.get()

    async def _forward(self, k: int, req: EngineRequest) -> None:
        assert self._merged is not None
        while True:
            out = await req.queue.get()
            self._merged.put_nowait((k, out))
            if out.usage is not None:
                return

    def close(self) -> None:
        """Abort every request that has not finished; idempotent."""
        for k in sorted(self._pending):
            self.engine.abort(self.requests[k].request_id)
        self._pending.clear()
        for task in self._forwarders:
            task.cancel()


def check_output(out: RequestOutput) -> None:
    """Raise the error a failed or engine-aborted output stands for (400 when the request's
    own constraints contradicted its grammar, else 500; 503)."""
    if out.error_code == GRAMMAR_REJECTED:
        raise APIError(400, f"generation failed: {out.error}", type="invalid_request_error",
                       code=GRAMMAR_REJECTED, counted=True)
    if out.error is not None or out.finish_reason is FinishReason.ERROR:
        raise APIError(500, f"generation failed: {out.error or 'unknown error'}",
                       type="server_error", code="engine_error", counted=True)
    if out.finish_reason is FinishReason.ABORT:
        raise unavailable("the request was aborted: the server is shutting down",
                          "shutting_down")


@dataclass
class ChoiceResult:
    """One finished choice of a non-streaming response."""

    index: int
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


def logprobs_of(out: RequestOutput) -> tuple[TokenLogprob, ...]:
    """Logprobs of the output's emitted tokens (a stop token's entry has no text: dropped)."""
    return out.logprobs[:len(out.token_ids)]


async def collect(stream: EngineStream, n: int) -> list[ChoiceResult]:
    """Read the stream to its end (ignoring keep-alive ticks); choices ordered by index
    ``prompt_index * n + sequence_index``."""
    choices: dict[int, ChoiceResult] = {}
    while not stream.done:
        item = await stream.next()
        if item is None:
            continue
        k, out = item
        check_output(out)
        idx = k * n + out.index
        choice = choices.setdefault(idx, ChoiceResult(idx))
        choice.text.append(out.text)
        choice.token_ids.extend(out.token_ids)
        choice.logprobs.extend(logprobs_of(out))
        if out.finish_reason is not None:
            choice.finish_reason = str(out.finish_reason)
    return [choices[i] for i in sorted(choices)]
