"""Small helpers shared by the cache tests."""

from __future__ import annotations

BS = 4


class Clock:
    """An injected clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self) -> float:
        self.now += 1
        return self.now


def toks(*firsts: int, tail: int = 0) -> list[int]:
    """Full blocks of ``BS`` tokens, block i filled with ``firsts[i]``, then ``tail`` tokens
    of -1 (a partial block)."""
    return [t for f in firsts for t in [f] * BS] + [-1] * tail
