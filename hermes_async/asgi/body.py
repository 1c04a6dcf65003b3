"""The request body from ``receive()``, within ``server.max_body_bytes`` (413
``request_too_large``: announced by ``content-length`` or found while it streams in) and
``server.body_read_timeout_s`` (408 :class:`~hermes_async.openai.limits.BodyReadTimeout`).
A client that disconnects before its body is in raises :class:`ClientGone`."""

from __future__ import annotations

import asyncio

from hermes_async.asgi.messages import Receive, Scope, content_length
from hermes_async.openai.limits import BodyReadTimeout, body_too_large


class ClientGone(Exception):
    """The client disconnected (``http.disconnect``): nothing is to be answered."""


async def read_body(scope: Scope, receive: Receive, max_bytes: int, timeout_s: float) -> bytes:
    """The whole body; 413 past ``max_bytes``, :class:`BodyReadTimeout` past ``timeout_s``,
    :class:`ClientGone` on a disconnect."""
    length = content_length(scope)
    if length is not None and length > max_bytes:
        raise body_too_large(max_bytes, length)
    try:
        async with asyncio.timeout(timeout_s):
            return await _receive_body(receive, max_bytes)
    except TimeoutError as e:
        raise BodyReadTimeout(timeout_s) from e


async def _receive_body(receive: Receive, max_bytes: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        part = bytes(message.get("body", b""))
        size += len(part)
        if size > max_bytes:
            raise body_too_large(max_bytes, None)
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)
