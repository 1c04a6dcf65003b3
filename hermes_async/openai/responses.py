"""What a service returns, for any front end to write out unchanged.

- :class:`JSONResponse`: a status, a JSON-able body object and extra headers;
- :class:`RawResponse`: ready bytes with their content type (``/metrics``);
- :class:`StreamingResponse`: status 200 with :data:`~hermes_async.openai.sse.SSE_HEADERS`
  and an async iterator of SSE byte chunks (events, keep-alive comments, ``data: [DONE]``);
  the front end writes each chunk as it comes and **always** awaits :meth:`aclose` when it
  stops (finished, client gone, write failed, handler cancelled): that aborts the engine
  requests still running.

Every response carries its ``status``, ``headers`` and ``content_type``; :meth:`payload`
gives the body bytes of the non-streaming kinds.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hermes_async.openai.errors import APIError
from hermes_async.openai.sse import SSE_HEADERS

JSON_CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class JSONResponse:
    """A JSON body (``body`` is the object, encoded by :meth:`payload`)."""

    body: Any
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = JSON_CONTENT_TYPE

    def payload(self) -> bytes:
        return msgspec.json.encode(self.body)


@dataclass(frozen=True)
class RawResponse:
    """Bytes of a given content type."""

    body: bytes
    content_type: str
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)

    def payload(self) -> bytes:
        return self.body


class StreamingResponse:
    """An SSE stream; iterate it for the chunks, then :meth:`aclose` (see the module doc)."""

    status = 200
    headers: Mapping[str, str] = SSE_HEADERS
    content_type = SSE_HEADERS["Content-Type"]

    def __init__(self, chunks: AsyncGenerator[bytes, None], on_close: Callable[[], None],
                 headers: Mapping[str, str] | None = None) -> None:
        self._chunks = chunks
        self._on_close = on_close
        if headers:
            self.headers = {**SSE_HEADERS, **headers}

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks

    async def aclose(self) -> None:
        """Stop the stream and abort what is unfinished; idempotent."""
        try:
            await self._chunks.aclose()
        finally:
            self._on_close()


Response = JSONResponse | RawResponse | StreamingResponse


def error_response(err: APIError) -> JSONResponse:
    """The JSON response of an :class:`APIError`: its status, error object and headers."""
    return JSONResponse(err.body(), status=err.status, headers=err.headers)
