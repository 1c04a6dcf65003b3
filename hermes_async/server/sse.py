"""Server-sent events as OpenAI streams them: ``data: {json}\\n\\n`` ... ``data: [DONE]\\n\\n``.

Comments (``: keep-alive\\n\\n``) keep idle connections (and proxies) from timing out; SSE
clients, the ``openai`` client included, ignore them.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import msgspec
from aiohttp import web

SSE_HEADERS = MappingProxyType({
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx: do not buffer the stream
})
DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"


def event(payload: Any) -> bytes:
    """One ``data:`` event; compact JSON never contains a raw newline."""
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


class SSEWriter:
    """Writes one SSE response; :meth:`start` sends the headers (status 200)."""

    def __init__(self) -> None:
        self.response = web.StreamResponse(status=200, headers=SSE_HEADERS)

    @property
    def started(self) -> bool:
        return self.response.prepared

    async def start(self, request: web.Request) -> None:
        await self.response.prepare(request)

    async def send(self, payload: Any) -> None:
        """Send one JSON event."""
        await self.response.write(event(payload))

    async def keepalive(self) -> None:
        """Send a keep-alive comment."""
        await self.response.write(KEEPALIVE)

    async def done(self) -> None:
        """Send ``data: [DONE]`` and end the response."""
        await self.response.write(DONE)
        await self.response.write_eof()
