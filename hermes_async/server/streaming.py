"""Drive an :class:`EngineStream` into an SSE response through a chunk formatter.

Errors before the first byte are ordinary JSON error responses (the handler raises them
before calling :func:`serve_stream`). Once the stream has started, an error becomes one event
``data: {"error": {...}}`` followed by ``data: [DONE]`` (as vLLM does). A client that goes away
ends the handler (aiohttp cancels it, or the next write fails) and ``stream.close()`` aborts
the engine requests.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any

from aiohttp import web

from hermes_async.engine.request import RequestOutput, Usage
from hermes_async.metrics import EngineMetrics
from hermes_async.server.errors import to_api_error
from hermes_async.server.generation import EngineStream, check_output, usage_dict
from hermes_async.server.sse import SSEWriter

log = logging.getLogger("hermes_async.server")


class ChunkFormatter(ABC):
    """Turns engine outputs into OpenAI chunk objects; chat and completions subclass it.

    ``head`` holds the fields every chunk repeats (id, object, created, model). With
    ``include_usage`` every chunk carries ``"usage": null`` and a last chunk the usage, as
    OpenAI streams do.
    """

    def __init__(self, head: dict[str, Any], include_usage: bool) -> None:
        self.head, self.include_usage = head, include_usage

    def chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        """One chunk holding ``choice``."""
        out = {**self.head, "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out

    def prelude(self) -> list[dict[str, Any]]:
        """Chunks sent before any output (chat: the ``role`` deltas)."""
        return []

    @abstractmethod
    def on_output(self, prompt_index: int, out: RequestOutput) -> list[dict[str, Any]]:
        """Chunks for one output (text delta, then a finish chunk when it finishes)."""

    def epilogue(self, usage: Usage) -> list[dict[str, Any]]:
        """Chunks after the last output (the ``usage`` chunk when asked for)."""
        if not self.include_usage:
            return []
        return [{**self.head, "choices": [], "usage": usage_dict(usage)}]


async def serve_stream(request: web.Request, stream: EngineStream, fmt: ChunkFormatter,
                       metrics: EngineMetrics) -> web.StreamResponse:
    """Stream ``stream`` as SSE; always closes (aborts what is unfinished of) ``stream``."""
    sse = SSEWriter()
    try:
        await sse.start(request)
        for chunk in fmt.prelude():
            await sse.send(chunk)
        while not stream.done:
            item = await stream.next()
            if item is None:
                await sse.keepalive()
                continue
            k, out = item
            check_output(out)
            for chunk in fmt.on_output(k, out):
                await sse.send(chunk)
        for chunk in fmt.epilogue(stream.usage):
            await sse.send(chunk)
        await sse.done()
    except ConnectionError:
        log.debug("client disconnected from a stream; request aborted")
    except Exception as e:  # noqa: BLE001 - after the headers, errors go in the stream
        err = to_api_error(e, retry_after_s=1)
        stream.close()
        if not sse.started:
            raise err from e  # still a plain JSON error (counted by the middleware)
        if not err.counted:
            metrics.request_errors.labels(err.code or "unknown").inc()
        try:
            await sse.send(err.body())
            await sse.done()
        except (ConnectionError, RuntimeError):
            log.debug("client gone before the error event of a stream")
    finally:
        stream.close()
    return sse.response
