"""The OpenAI layer's responses written out by aiohttp, each write bounded in time.

A JSON or raw response becomes a ``web.Response`` with its status, headers and content type,
written here (not after the handler returns) so that its write is bounded too. A streaming
one becomes a ``web.StreamResponse``: each SSE chunk is written as it comes (events,
keep-alive comments, ``data: [DONE]``); whatever ends it -- the last chunk, a write to a client
that went away, the handler's cancellation on disconnect, a client that stopped reading --
closes the stream, which aborts the engine requests still running.

**Slow and stuck readers.** aiohttp's ``write`` awaits the transport's drain once its buffer
is past 64 KiB, i.e. while a client that does not read has filled its TCP window, the
kernel's send buffer and that buffer. A stream's writes may wait ``server.write_timeout_s``
in total while the stream is *behind* -- from the moment its iterator last had to wait for the
engine (nothing unsent queued: the client kept up); past it the connection is aborted
(buffered bytes dropped, no flush), the stream's engine requests with it (KV blocks released),
and a warning names the reason (``client stopped reading for 30 s``). The total, not each
write's wait, is what counts: a kernel that keeps growing its send buffer (loopback does) or a
client that reads a little now and then lets single writes through while the backlog grows.
A non-streaming response is one write, bounded the same.

Nothing else waits for that client: the engine step loop only ``put_nowait``\\ s outputs on
each request's queue, so other streams keep going. What a stream that fell behind holds is
bounded: about 128 KiB in aiohttp and asyncio, the kernel's socket buffer, and the engine
outputs queued unread -- at most about its tokens per second x ``write_timeout_s`` (the writes
that do get through while it is behind take microseconds: the time behind is write time).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Generator
from typing import Any, TypeVar

from aiohttp import web

from hermes_async.openai.responses import JSONResponse, RawResponse, Response, StreamingResponse
from hermes_async.server.state import STATE

log = logging.getLogger("hermes_async.server")

T = TypeVar("T")


class ClientStoppedReading(Exception):
    """The client's writes waited longer than the write timeout."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"client stopped reading for {timeout_s:g} s")
        self.timeout_s = timeout_s


class WriteClock:
    """The time a response's writes have waited since it last kept up, within ``limit_s``."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.waited_s = 0.0

    def caught_up(self) -> None:
        """The client has taken everything there was: its clock starts again."""
        self.waited_s = 0.0

    async def write(self, write: Awaitable[object]) -> None:
        """Await one write (``prepare``, ``write``, ``write_eof``) for at most what is left;
        :class:`ClientStoppedReading` past it."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            async with asyncio.timeout(max(0.0, self.limit_s - self.waited_s)):
                await write
        except TimeoutError as e:
            raise ClientStoppedReading(self.limit_s) from e
        finally:
            self.waited_s += loop.time() - start


class Pull:
    """``await Pull(aw)`` is ``await aw``, noting in :attr:`waited` whether it had to wait
    (suspended) for its result: for a stream's next chunk, that the client had kept up."""

    __slots__ = ("_aw", "waited")

    def __init__(self, aw: Awaitable[T]) -> None:
        self._aw = aw
        self.waited = False

    def __await__(self) -> Generator[Any, Any, Any]:
        it = self._aw.__await__()
        try:
            signal = it.send(None)
        except StopIteration as done:
            return done.value
        self.waited = True
        while True:  # what ``yield from it`` would do, from its second step on
            try:
                sent = yield signal
            except BaseException as e:  # noqa: BLE001 - thrown in (cancellation): pass it on
                try:
                    signal = it.throw(e)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    signal = it.send(sent)
                except StopIteration as done:
                    return done.value


def abort_connection(request: web.Request, reason: BaseException) -> None:
    """Drop the client's connection at once (``transport.abort``: a ``close`` would wait for
    the buffered bytes to flush, i.e. forever for a client that does not read), with a logged
    warning."""
    log.warning("aborted the response of %s %s to %s: %s", request.method, request.path,
                request.remote, reason)
    transport = request.transport
    if transport is not None:
        transport.abort()


def plain_response(response: JSONResponse | RawResponse) -> web.Response:
    """``response`` as a ``web.Response`` (not written yet)."""
    return web.Response(status=response.status, body=response.payload(),
                        headers={**response.headers, "Content-Type": response.content_type})


def write_clock(request: web.Request) -> WriteClock:
    """A clock for ``server.write_timeout_s`` of the request's app."""
    return WriteClock(request.app[STATE].config.server.write_timeout_s)


async def send(request: web.Request, out: web.Response, *, close: bool = False) -> web.Response:
    """Write ``out`` now, within the write timeout (an aborted connection past it); with
    ``close`` the connection is closed after it, without reading the rest of the body."""
    if close:
        out.force_close()
    clock = write_clock(request)
    try:
        await clock.write(out.prepare(request))
        await clock.write(out.write_eof())
    except ConnectionError:
        log.debug("client disconnected before its response was written")
    except ClientStoppedReading as e:
        abort_connection(request, e)
    if close:
        request.protocol.force_close()  # flushes what is written, then closes; no lingering
    return out


async def stream_response(request: web.Request,
                          response: StreamingResponse) -> web.StreamResponse:
    """Write ``response``'s chunks to the client; always closes ``response``."""
    clock = write_clock(request)
    out = web.StreamResponse(status=response.status, headers=response.headers)
    stalled: ClientStoppedReading | None = None
    chunks = aiter(response)
    try:
        await clock.write(out.prepare(request))
        while True:
            pull = Pull(anext(chunks))
            try:
                chunk = await pull
            except StopAsyncIteration:
                break
            if pull.waited:
                clock.caught_up()
            await clock.write(out.write(chunk))
        await clock.write(out.write_eof())
    except ConnectionError:
        log.debug("client disconnected from a stream; request aborted")
    except ClientStoppedReading as e:
        stalled = e
    finally:
        await response.aclose()  # aborts the engine requests (before the connection goes)
    if stalled is not None:
        abort_connection(request, stalled)
    return out


async def respond(request: web.Request, response: Response) -> web.StreamResponse:
    """Write any response of a service."""
    if isinstance(response, StreamingResponse):
        return await stream_response(request, response)
    return await send(request, plain_response(response))
