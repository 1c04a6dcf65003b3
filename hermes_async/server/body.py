"""The request body within ``server.max_body_bytes`` (413 ``request_too_large`` past it)."""

from __future__ import annotations

from aiohttp import web

from hermes_async.openai.limits import body_too_large


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The request body; 413 when it is (or announces itself as) larger than ``max_bytes``.

    The app's ``client_max_size`` enforces the same bound on bodies without a length.
    """
    length = request.content_length
    if length is not None and length > max_bytes:
        raise body_too_large(max_bytes, length)
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise body_too_large(max_bytes, None) from e
