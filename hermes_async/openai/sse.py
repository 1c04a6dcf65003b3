"""Server-sent events as OpenAI streams them: ``data: {json}\\n\\n`` ... ``data: [DONE]\\n\\n``.

Comments (``: keep-alive\\n\\n``) keep idle connections (and proxies) from timing out; SSE
clients, the ``openai`` client included, ignore them. :data:`SSE_HEADERS` are the headers of
every streamed response (status 200).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import msgspec

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
