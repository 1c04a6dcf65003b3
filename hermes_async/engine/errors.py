"""Errors the engine raises to its callers (the server maps each to a status)."""

from __future__ import annotations


class EngineError(RuntimeError):
    """The engine is not running, or is shutting down (the server's 503)."""


class QueueFullError(RuntimeError):
    """The admission queue is over its bound (the server's 429)."""


class NamespaceBusyError(RuntimeError):
    """A cache reset was refused: requests of these namespaces are in flight (the server's
    409 ``namespace_busy``)."""

    def __init__(self, namespaces: list[str]) -> None:
        super().__init__(f"requests are in flight in {', '.join(namespaces)}; retry when they "
                         "are done")
        self.namespaces = namespaces
