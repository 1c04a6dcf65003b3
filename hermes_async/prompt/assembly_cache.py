"""The assembly cache (the first cache level, before the KV prefix cache): rendered
prompts and their token ids.

A bounded LRU over entries and (estimated) bytes. Keys are built by the assembler from model id,
template version, role sequence and a blake2b content digest (plus tools, generation prompt and
tokenization options), so an entry built under one template version can never be returned for
another. The cache stops at token ids; KV state is the prefix cache's job.

Thread-safe (one lock); the counters are per cache object: exact hits, partial (incremental)
hits, misses, evictions.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal, NamedTuple

CacheOutcome = Literal["hit", "partial", "miss"]

_INT_BYTES = 32  # an int object plus its tuple slot, an upper-bound estimate


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One assembled prompt.

    ``marked_text`` is the rendered text with user strings marked (see ``tokenize``), used to
    verify incremental reuse; ``text`` is the real prompt text. ``cuts`` are ``(char offset in
    marked_text, token index)`` of the last few template control tokens, latest first: the ids
    before one may be reused by a conversation whose rendering starts with ``marked_text`` up
    to the end of that control token.
    """

    token_ids: tuple[int, ...]
    marked_text: str
    text: str
    cuts: tuple[tuple[int, int], ...]

    @property
    def nbytes(self) -> int:
        """Estimated memory held by this entry."""
        size = sys.getsizeof(self.token_ids) + _INT_BYTES * len(self.token_ids)
        size += sys.getsizeof(self.marked_text)
        if self.text is not self.marked_text:
            size += sys.getsizeof(self.text)
        return size + 64


class CacheStats(NamedTuple):
    """A snapshot of an :class:`AssemblyCache`'s counters and occupancy."""

    hits: int
    partial_hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int

    @property
    def hit_rate(self) -> float:
        """(exact + partial hits) / lookups; 0.0 before the first lookup."""
        total = self.hits + self.partial_hits + self.misses
        return (self.hits + self.partial_hits) / total if total else 0.0


class AssemblyCache:
    """Bounded LRU of :class:`CacheEntry`, by entry count and estimated bytes.

    ``max_entries`` and ``max_bytes`` must be positive. An entry larger than ``max_bytes`` is
    not stored. Inserting evicts least recently used entries until both bounds hold.
    """

    def __init__(self, max_entries: int = 4096, max_bytes: int = 256 * 1024 * 1024) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be positive")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[CacheEntry, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._counts = {"hit": 0, "partial": 0, "miss": 0}
        self._evictions = 0

    def get(self, key: Hashable) -> CacheEntry | None:
        """The entry for ``key`` (marked most recently used), or ``None``. Counts nothing."""
        with self._lock:
            item = self._entries.get(key)
            if item is None:
                return None
            self._entries.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, entry: CacheEntry) -> bool:
        """Store ``entry`` under ``key``, evicting LRU entries; ``False`` if it alone is too big."""
        size = entry.nbytes
        if size > self.max_bytes:
            return False
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (entry, size)
            self._bytes += size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted
                self._evictions += 1
        return True

    def record(self, outcome: CacheOutcome) -> None:
        """Count one assembly outcome (called by the assembler)."""
        with self._lock:
            self._counts[outcome] += 1

    def clear(self) -> None:
        """Drop every entry (counters are kept)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        """Counters and occupancy now."""
        with self._lock:
            c = self._counts
            return CacheStats(c["hit"], c["partial"], c["miss"], self._evictions,
                              len(self._entries), self._bytes)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    @property
    def bytes_used(self) -> int:
        """Estimated bytes held by all entries."""
        return self._bytes
