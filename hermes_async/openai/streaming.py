"""Drive an :class:`EngineStream` through a chunk formatter into SSE byte chunks.

Errors before the stream exists are ordinary JSON error responses (the service raises them
before calling :func:`sse_response`). Once the stream has started, an error becomes one event
``data: {"error": {...}}`` followed by ``data: [DONE]`` (as vLLM does), counted in
``hermes_request_errors_total{code}``. The iterator never raises otherwise; the response's
close hook (the front end awaits it when the client goes away, a write fails or the handler
is cancelled) aborts the engine requests.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from hermes_async.metrics import EngineMetrics
from hermes_async.openai.errors import to_api_error
from hermes_async.openai.format import ChunkFormatter
from hermes_async.openai.responses import StreamingResponse
from hermes_async.openai.sse import DONE, KEEPALIVE, event
from hermes_async.openai.stream import EngineStream, check_output


def sse_response(stream: EngineStream, fmt: ChunkFormatter,
                 metrics: EngineMetrics) -> StreamingResponse:
    """The streamed response of ``stream``; closing it closes (aborts) ``stream``."""
    return StreamingResponse(sse_chunks(stream, fmt, metrics), stream.close, stream.headers())


async def sse_chunks(stream: EngineStream, fmt: ChunkFormatter,
                     metrics: EngineMetrics) -> AsyncGenerator[bytes, None]:
    """The SSE bytes of ``stream``: the prelude, one event per chunk, a keep-alive comment
    per idle interval, the epilogue and ``data: [DONE]``; always closes ``stream``."""
    try:
        for chunk in fmt.prelude():
            yield event(chunk)
        while not stream.done:
            item = await stream.next()
            if item is None:
                yield KEEPALIVE
                continue
            k, out = item
            check_output(out)
            for chunk in fmt.on_output(k, out):
                yield event(chunk)
        for chunk in fmt.epilogue(stream.usage):
            yield event(chunk)
        yield DONE
    except Exception as e:  # noqa: BLE001 - after the first byte, errors go in the stream
        err = to_api_error(e, retry_after_s=1)
        stream.close()
        if not err.counted:
            metrics.request_errors.labels(err.code or "unknown").inc()
        yield event(err.body())
        yield DONE
    finally:
        stream.close()
