"""Errors raised by the KV cache package.

Running out of blocks is not an error: allocation returns ``None``. These exceptions mean the
caller broke a contract (a double release, a reset while requests hold blocks) or that the
bookkeeping itself is corrupt (:class:`IntegrityError`).
"""

from __future__ import annotations


class CacheError(RuntimeError):
    """The cache API was misused: unknown or twice-released request, reset while pinned, ..."""


class IntegrityError(CacheError):
    """``check_integrity()`` found bookkeeping that breaks a cache invariant."""
