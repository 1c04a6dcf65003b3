"""The request head's limits, checked by the server itself so that a request past them gets an
OpenAI error object rather than aiohttp's plain-text 400.

``server.max_request_line_bytes`` bounds the request line (method, path with query, version:
414 ``uri_too_long`` past it), ``server.max_header_bytes`` one header field, name plus value,
and ``server.max_headers`` the number of fields (431 ``request_header_fields_too_large``
past either). The error middleware asks :func:`head_error` before anything else runs
(authentication included), answers, and closes the connection without reading the body.

aiohttp's parser must let such a head through to be checked: :func:`parser_limits` gives it
hard caps of :data:`PARSER_FACTOR` times the line and field limits (at least
:data:`PARSER_FLOOR_BYTES`) and twice the field count. A head past those is still refused by
the parser itself, before any middleware: 400 Bad Request in plain text, connection closed.
While it parses, a connection's head may hold up to (twice the count) x (the field cap) bytes:
16 MiB with the defaults (256 fields of 64 KiB), the order of one ``max_body_bytes`` body.
"""

from __future__ import annotations

from aiohttp import web

from hermes_async.config import ServerConfig
from hermes_async.openai.errors import APIError, http_error

PARSER_FACTOR = 4
"""aiohttp's line and field caps are this many times the configured limits ..."""
PARSER_FLOOR_BYTES = 64 << 10
"""... and at least this many bytes; its header count cap is twice ``max_headers``."""


def parser_limits(server: ServerConfig) -> dict[str, int]:
    """aiohttp's parser keywords (``max_line_size``, ``max_field_size``, ``max_headers``):
    hard caps above ``server``'s limits, so that :func:`head_error` sees what is past them."""
    def cap(limit: int) -> int:
        return max(PARSER_FACTOR * limit, PARSER_FLOOR_BYTES)

    return {"max_line_size": cap(server.max_request_line_bytes),
            "max_field_size": cap(server.max_header_bytes),
            "max_headers": 2 * server.max_headers}


def request_line_bytes(request: web.Request) -> int:
    """The size of ``METHOD target HTTP/x.y`` as it arrived (without the CRLF)."""
    target = request.raw_path.encode("utf-8", "surrogateescape")
    return len(request.method) + len(target) + len(" HTTP/1.1") + 1


def head_error(request: web.Request, server: ServerConfig) -> APIError | None:
    """414 ``uri_too_long`` for a request line past ``server.max_request_line_bytes``, 431
    ``request_header_fields_too_large`` for more than ``server.max_headers`` fields or one
    past ``server.max_header_bytes`` (name plus value); None when the head is within them.
    The message names the field, never its value (a cookie or a key)."""
    line = request_line_bytes(request)
    if line > server.max_request_line_bytes:
        return http_error(414, f"the request line is {line} bytes, more than the "
                          f"{server.max_request_line_bytes} bytes allowed")
    fields = request.raw_headers
    if len(fields) > server.max_headers:
        return http_error(431, f"the request has {len(fields)} header fields, more than the "
                          f"{server.max_headers} allowed")
    for name, value in fields:
        size = len(name) + len(value)
        if size > server.max_header_bytes:
            shown = name[:64].decode("latin-1")
            return http_error(431, f"header field {shown!r} is {size} bytes (name plus value), "
                              f"more than the {server.max_header_bytes} bytes allowed")
    return None
