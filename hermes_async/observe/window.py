"""Sums over a sliding time window, in one-second buckets (for "hit rate over the last minute").
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RollingSums:
    """Named sums of the values added during the last ``window_s`` seconds.

    Memory is one small dict per second that saw an event; reads drop expired buckets.
    """

    def __init__(self, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self._clock = clock
        self._buckets: deque[tuple[int, dict[str, float]]] = deque()

    def add(self, **values: float) -> None:
        """Add ``values`` (name -> amount) at the current time."""
        second = int(self._clock())
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append((second, {}))
            self._expire(second)
        bucket = self._buckets[-1][1]
        for name, v in values.items():
            bucket[name] = bucket.get(name, 0.0) + v

    def sums(self) -> dict[str, float]:
        """Each name's total over the window (names never added are absent)."""
        self._expire(int(self._clock()))
        out: dict[str, float] = {}
        for _, bucket in self._buckets:
            for name, v in bucket.items():
                out[name] = out.get(name, 0.0) + v
        return out

    def _expire(self, now_second: int) -> None:
        oldest = now_second - self.window_s
        while self._buckets and self._buckets[0][0] <= oldest:
            self._buckets.popleft()
