from __future__ import annotations

import pytest

from hermes_async.cache import BlockPool, CacheError, IntegrityError


def test_allocate_is_all_or_nothing_and_returns_none_when_short() -> None:
    pool = BlockPool(4)
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.allocate(2) is None  # only one left: nothing handed out
    assert pool.num_free == 1
    assert pool.allocate(0) == []
    assert pool.allocate(1) == [3]
    assert pool.allocate(1) is None
    with pytest.raises(ValueError):
        pool.allocate(-1)


def test_free_rejects_double_free_and_foreign_ids_before_changing_anything() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    assert blocks is not None
    with pytest.raises(CacheError, match="freed twice"):
        pool.free([blocks[0], blocks[0]])
    with pytest.raises(CacheError, match="freed twice"):
        pool.free([blocks[0], 3])  # 3 was never handed out
    with pytest.raises(CacheError, match="not in the pool"):
        pool.free([7])
    assert pool.num_free == 2 and not pool.is_free(blocks[0])
    pool.free(blocks)
    assert pool.num_free == 4 and pool.num_used == 0
    pool.check_integrity()


def test_pool_integrity_catches_a_listed_but_unflagged_block() -> None:
    pool = BlockPool(3)
    pool.allocate(1)
    pool._free.append(0)  # corrupt: listed free, flagged used
    with pytest.raises(IntegrityError):
        pool.check_integrity()


def test_pool_needs_a_block() -> None:
    with pytest.raises(ValueError):
        BlockPool(0)
