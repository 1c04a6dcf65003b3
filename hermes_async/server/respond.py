"""The OpenAI layer's responses written out by aiohttp.

A JSON or raw response becomes a ``web.Response`` with its status, headers and content type.
A streaming one becomes a ``web.StreamResponse``: each SSE chunk is written as it comes (events,
keep-alive comments, ``data: [DONE]``); whatever ends it -- the last chunk, a write to a client
that went away, the handler's cancellation on disconnect -- closes the stream, which aborts
the engine requests still running.
"""

from __future__ import annotations

import logging

from aiohttp import web

from hermes_async.openai.responses import JSONResponse, RawResponse, Response, StreamingResponse

log = logging.getLogger("hermes_async.server")


def plain_response(response: JSONResponse | RawResponse) -> web.Response:
    """``response`` as a ``web.Response``."""
    return web.Response(status=response.status, body=response.payload(),
                        headers={**response.headers, "Content-Type": response.content_type})


async def stream_response(request: web.Request,
                          response: StreamingResponse) -> web.StreamResponse:
    """Write ``response``'s chunks to the client; always closes ``response``."""
    out = web.StreamResponse(status=response.status, headers=response.headers)
    try:
        await out.prepare(request)
        async for chunk in response:
            await out.write(chunk)
        await out.write_eof()
    except ConnectionError:
        log.debug("client disconnected from a stream; request aborted")
    finally:
        await response.aclose()
    return out


async def respond(request: web.Request, response: Response) -> web.StreamResponse:
    """Write any response of a service."""
    if isinstance(response, StreamingResponse):
        return await stream_response(request, response)
    return plain_response(response)
