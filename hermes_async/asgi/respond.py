"""The OpenAI layer's responses written as ASGI messages, each send bounded in time, and the
watch for a client that goes away.

- A JSON or raw response is ``http.response.start`` (status, its headers, ``content-type``,
  ``content-length``) and one ``http.response.body``.
- A streaming one is the start, each SSE chunk as it comes (``more_body`` true), then an
  empty last body. Whatever ends it -- the last chunk, a send that failed, a client that
  stopped reading, cancellation -- closes the stream (``await response.aclose()``) first,
  which aborts the engine requests still running (their KV blocks are released).

**Disconnects.** :func:`until_disconnect` runs a service call and its response in a task while
another one watches ``receive()`` for ``http.disconnect``; a disconnect cancels the call at
once (a stream's ``finally`` closes it, a non-streaming service aborts its engine requests),
and so does the cancellation of the app's own task (Ray Serve cancels a request whose client
went away).

**Slow and stuck readers.** A server's ``send`` waits while its transport's buffer is full
(uvicorn: flow control past 64 KiB), i.e. while a client that does not read has filled its
TCP window, the kernel's send buffer and that buffer. :class:`SendClock` lets a response's
sends wait ``server.write_timeout_s`` in total while it is *behind* -- from the moment its
stream last had to wait for the engine (the client had taken everything there was); past it
the response ends with a warning (``client stopped reading for 30 s``), the stream is closed
(its engine requests aborted) and the app returns without completing the response, on which
the server closes the connection (ASGI has no abort: uvicorn's ``transport.close()`` keeps
what is buffered, a bounded amount, until the kernel gives up).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Coroutine
from typing import Any

from hermes_async.asgi.messages import (
    Message,
    Receive,
    Send,
    body_message,
    encode_headers,
    start_message,
)
from hermes_async.openai.responses import JSONResponse, RawResponse, Response, StreamingResponse

log = logging.getLogger("hermes_async.asgi")


class SendClock:
    """A response's ``send``, bounded: its waits add up since the stream last caught up, and
    once they reach ``limit_s`` a send raises ``TimeoutError``."""

    def __init__(self, send: Send, limit_s: float) -> None:
        self._send = send
        self.limit_s = limit_s
        self.behind_s = 0.0

    def caught_up(self) -> None:
        """The client has taken everything there was: the clock starts again."""
        self.behind_s = 0.0

    async def __call__(self, message: Message) -> None:
        """Send ``message`` within what is left of the time (``TimeoutError`` past it)."""
        now = asyncio.get_running_loop().time
        began = now()
        try:
            async with asyncio.timeout(max(0.0, self.limit_s - self.behind_s)):
                await self._send(message)
        finally:
            self.behind_s += now() - began


async def next_chunk(chunks: AsyncIterator[bytes], clock: SendClock) -> bytes | None:
    """The stream's next chunk, ``None`` at its end. When the stream had to wait for it (the
    loop got to run the callback scheduled before asking), the client had kept up: ``clock``
    starts again."""
    handle = asyncio.get_running_loop().call_soon(clock.caught_up)
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        return None
    finally:
        handle.cancel()


async def write_plain(send: SendClock, response: JSONResponse | RawResponse, *,
                      head: bool = False, close: bool = False) -> None:
    """``response`` in two messages (``head``: without its body; ``close``: with
    ``connection: close``, the server closes the connection after it)."""
    body = response.payload()
    extra = [("content-type", response.content_type), ("content-length", str(len(body)))]
    if close:
        extra.append(("connection", "close"))
    await send(start_message(response.status, encode_headers(response.headers, extra)))
    await send(body_message(b"" if head else body, more=False))


async def write_stream(send: SendClock, response: StreamingResponse) -> None:
    """``response``'s chunks as they come; always closes it before the last message."""
    chunks = aiter(response)
    try:
        headers = encode_headers(response.headers, [("content-type", response.content_type)])
        await send(start_message(response.status, headers))
        while (chunk := await next_chunk(chunks, send)) is not None:
            await send(body_message(chunk, more=True))
    finally:
        await response.aclose()  # aborts the engine requests still running
    await send(body_message(b"", more=False))


async def respond(send: SendClock, response: Response, *, head: bool = False,
                  close: bool = False) -> None:
    """Write any response of a service; a client that stopped reading (logged) or whose
    connection failed ends it."""
    try:
        if isinstance(response, StreamingResponse):
            await write_stream(send, response)
        else:
            await write_plain(send, response, head=head, close=close)
    except TimeoutError:
        log.warning("ended a response of status %d: client stopped reading for %g s",
                    response.status, send.limit_s)
    except OSError as e:
        log.debug("client connection failed during its response: %s", e)


async def serve(send: SendClock, call: Awaitable[Response], *, head: bool = False) -> None:
    """Await a service ``call`` and write its response."""
    await respond(send, await call, head=head)


async def until_disconnect(receive: Receive, work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end, or until the client disconnects (or this task is cancelled):
    then ``work`` is cancelled. Either way it has finished when this returns (or re-raises
    the cancellation)."""
    worker = asyncio.create_task(work)
    watcher = asyncio.create_task(wait_for_disconnect(receive))
    try:
        await asyncio.wait((worker, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        worker.cancel()  # nothing when it is done
        await asyncio.wait((worker,))
    if not worker.cancelled():
        worker.result()  # what failed unexpectedly goes to the server's log


async def wait_for_disconnect(receive: Receive) -> None:
    """Return on ``http.disconnect`` (or when ``receive`` fails: the connection is gone)."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception as e:  # noqa: BLE001 - a broken receive is a client gone
        log.debug("receive failed while watching for a disconnect: %s", e)
