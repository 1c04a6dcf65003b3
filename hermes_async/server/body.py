"""The request body within ``server.max_body_bytes`` (413 ``request_too_large`` past it) and
``server.body_read_timeout_s`` (408 ``request_timeout`` past it; the error middleware then
closes the connection)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from hermes_async.openai.limits import BodyReadTimeout, body_too_large

__all__ = ["BodyReadTimeout", "read_body"]


async def read_body(request: web.Request, max_bytes: int, timeout_s: float) -> bytes:
    """The request body; 413 when it is (or announces itself as) larger than ``max_bytes``,
    :class:`BodyReadTimeout` when it takes longer than ``timeout_s`` to arrive.

    The app's ``client_max_size`` enforces the same bound on bodies without a length.
    """
    length = request.content_length
    if length is not None and length > max_bytes:
        raise body_too_large(max_bytes, length)
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError as e:
        raise BodyReadTimeout(timeout_s) from e
    except web.HTTPRequestEntityTooLarge as e:
        raise body_too_large(max_bytes, None) from e
