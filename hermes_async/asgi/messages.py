"""ASGI 3 in types and the few message helpers the app needs (no framework).

A scope's ``headers`` is a list of ``(name, value)`` byte pairs, names lower-cased; a response
is one ``http.response.start`` (status, headers) then ``http.response.body`` messages, the last
with ``more_body`` false.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of the request header ``name`` (lower case), decoded as latin-1."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def content_length(scope: Scope) -> int | None:
    """The announced body length; ``None`` without one (or an unreadable one: the server's
    parser refuses those before the app sees them)."""
    value = header(scope, b"content-length")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def route_path(scope: Scope) -> str:
    """The path to route on: ``path`` without the ``root_path`` the app is mounted at, when
    the server left it in (uvicorn's ``--root-path`` and Ray Serve's route prefix do)."""
    path: str = scope["path"]
    root = str(scope.get("root_path") or "").rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root):] or "/"
    return path


def query_of(scope: Scope) -> dict[str, str]:
    """The query parameters, the first value of each (blank values kept, as aiohttp does)."""
    query: dict[str, str] = {}
    raw = bytes(scope.get("query_string", b"")).decode("latin-1")
    for key, value in parse_qsl(raw, keep_blank_values=True):
        query.setdefault(key, value)
    return query


def encode_headers(headers: Mapping[str, str],
                   extra: Iterable[tuple[str, str]] = ()) -> list[tuple[bytes, bytes]]:
    """Response headers as ASGI byte pairs with lower-case names; ``extra`` overrides."""
    merged = {k.lower(): v for k, v in headers.items()}
    merged.update((k.lower(), v) for k, v in extra)
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in merged.items()]


def start_message(status: int, headers: list[tuple[bytes, bytes]]) -> Message:
    """``http.response.start``."""
    return {"type": "http.response.start", "status": status, "headers": headers}


def body_message(body: bytes, *, more: bool) -> Message:
    """``http.response.body`` (``more``: more body follows)."""
    return {"type": "http.response.body", "body": body, "more_body": more}
