"""Physical KV block ids ``0 .. num_blocks-1`` and the free list over them."""

from __future__ import annotations

from collections.abc import Iterable

from hermes_async.cache.errors import CacheError, IntegrityError


class BlockPool:
    """The free list of a fixed set of physical blocks.

    Contract: a block is either free or handed out; who holds a handed-out block (a tree node or
    a request) is the caller's bookkeeping (see :class:`KVCacheManager`). :meth:`allocate` is
    all-or-nothing and returns None when it cannot be satisfied. :meth:`free` raises
    :class:`CacheError` for an id out of range or already free: a double free is a bookkeeping
    bug and must surface at once, before anything is changed.
    """

    __slots__ = ("_num_blocks", "_free", "_is_free")

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, not {num_blocks}")
        self._num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, ...
        self._is_free = bytearray(b"\x01") * num_blocks

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self._num_blocks - len(self._free)

    def is_free(self, block_id: int) -> bool:
        return 0 <= block_id < self._num_blocks and bool(self._is_free[block_id])

    def allocate(self, n: int) -> list[int] | None:
        """Hand out ``n`` free blocks, or return None (and change nothing) if fewer are free."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        if n > len(self._free):
            return None
        if n == 0:
            return []
        blocks = self._free[-n:]
        del self._free[-n:]
        blocks.reverse()
        for b in blocks:
            self._is_free[b] = 0
        return blocks

    def free(self, block_ids: Iterable[int]) -> None:
        """Return blocks to the free list; all are validated before any is freed."""
        ids = list(block_ids)
        seen: set[int] = set()
        for b in ids:
            if not 0 <= b < self._num_blocks:
                raise CacheError(f"block {b} is not in the pool (0..{self._num_blocks - 1})")
            if self._is_free[b] or b in seen:
                raise CacheError(f"block {b} freed twice")
            seen.add(b)
        for b in ids:
            self._is_free[b] = 1
        self._free.extend(ids)

    def free_block_ids(self) -> list[int]:
        """A copy of the free list (for integrity checks and tests)."""
        return list(self._free)

    def check_integrity(self) -> None:
        """Free list and free flags agree; no id is listed twice."""
        listed = set(self._free)
        if len(listed) != len(self._free):
            raise IntegrityError("free list holds a block id twice")
        flagged = {b for b in range(self._num_blocks) if self._is_free[b]}
        if listed != flagged:
            raise IntegrityError(
                f"free list and free flags disagree on blocks {sorted(listed ^ flagged)[:10]}")
