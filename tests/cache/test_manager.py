from __future__ import annotations

import pytest

from hermes_async.cache import CacheError, CacheUsage, KVCacheManager
from hermes_async.config import CacheConfig
from tests.cache.helpers import BS, Clock, toks


def make(num_blocks: int = 32, **kw: object) -> KVCacheManager:
    kw.setdefault("clock", Clock())
    return KVCacheManager(num_blocks, BS, **kw)  # type: ignore[arg-type]


def test_block_table_is_cached_blocks_then_private_blocks() -> None:
    m = make()
    prompt = toks(1, 2, tail=2)
    a = m.admit("r1", "ns", prompt)
    assert a is not None and a.matched_len == 0 and len(a.block_table) == 3
    assert m.commit("r1", prompt) == 2 * BS
    b = m.admit("r2", "ns", toks(1, 2, 3, tail=1))
    assert b is not None and b.matched_len == 2 * BS
    assert b.block_table[:2] == a.block_table[:2] and len(b.block_table) == 4
    assert set(b.block_table[2:]).isdisjoint(a.block_table)
    assert m.usage() == CacheUsage(32, 32 - 5, 0, 2, 3)
    m.check_integrity()


def test_whole_prompt_hit_leaves_the_last_token_to_compute() -> None:
    m = make()
    m.admit("r1", "ns", toks(1, 2))
    m.commit("r1", toks(1, 2))
    m.release("r1")
    again = m.admit("r2", "ns", toks(1, 2))
    assert again is not None and again.matched_len == BS
    assert m.probe("ns", toks(1, 2, tail=1)) == 2 * BS
    m.check_integrity()


def test_concurrent_duplicate_is_freed_and_table_switches_to_the_cached_block() -> None:
    m = make()
    prompt = toks(1, 2, tail=1)
    a, b = m.admit("r1", "ns", prompt), m.admit("r2", "ns", prompt)  # both miss
    assert a is not None and b is not None and a.block_table != b.block_table
    m.commit("r1", prompt)
    free_before = m.usage().free
    m.commit("r2", prompt)  # r1 cached blocks 1, 2 first
    assert m.block_table("r2")[:2] == a.block_table[:2]
    assert m.block_table("r2")[2] == b.block_table[2]
    assert m.usage().free == free_before + 2
    assert m.stats().namespaces["ns"].duplicate_blocks == 2
    m.check_integrity()
    m.release("r1")
    m.release("r2")
    assert m.usage().cached == 2
    m.check_integrity()


def test_allocation_failure_returns_none_and_changes_nothing() -> None:
    m = make(num_blocks=4)
    assert m.admit("big", "ns", toks(1, 2, 3, 4, tail=1)) is None
    assert "big" not in m
    assert m.usage() == CacheUsage(4, 4, 0, 0, 0)
    st = m.stats()
    assert st.allocation_failures == 1 and st.namespaces == {}
    m.admit("r1", "ns", toks(1, 2, tail=1))
    assert m.grow("r1", 5 * BS) is None
    assert len(m.block_table("r1")) == 3
    assert m.grow("r1", 3 * BS) == [] and m.grow("r1", 4 * BS) is not None
    m.check_integrity()


def test_feasibility_does_not_count_blocks_the_admission_itself_pins() -> None:
    m = make(num_blocks=3)
    m.admit("r1", "ns", toks(1, 2, tail=1))
    m.commit("r1", toks(1, 2, tail=1))
    m.release("r1")  # 2 cached (unpinned), 1 free
    # matches both cached blocks, then needs 2 more: the matched ones cannot be evicted for it
    assert m.admit("r2", "ns", toks(1, 2, 3, tail=1)) is None
    m.check_integrity()
    # needing only one more block works, and keeps the matched path
    ok = m.admit("r3", "ns", toks(1, 2, tail=3))
    assert ok is not None and ok.matched_len == 2 * BS
    m.check_integrity()


def test_admission_evicts_least_recently_used_cached_blocks() -> None:
    m = make(num_blocks=4)
    for i, first in enumerate((1, 2)):
        m.admit(f"r{i}", "ns", toks(first, tail=1))
        m.commit(f"r{i}", toks(first, tail=1))
        m.release(f"r{i}")
    m.tree._clock.advance()  # type: ignore[attr-defined]
    assert m.probe("ns", toks(1, tail=1)) == BS
    assert m.admit("r9", "ns", toks(7, 8, 9, tail=1)) is not None  # needs 4: evicts both
    assert m.probe("ns", toks(1, tail=1)) == m.probe("ns", toks(2, tail=1)) == 0
    m.check_integrity()


def test_pinned_request_survives_any_eviction_pressure() -> None:
    m = make()
    m.admit("r1", "ns", toks(1, 2, 3, tail=1))
    m.commit("r1", toks(1, 2, 3, tail=1))
    assert m.evict(10**6) == 0
    assert m.probe("ns", toks(1, 2, 3, tail=1)) == 3 * BS
    m.release("r1")
    assert m.evict(10**6) == 3
    m.check_integrity()


def test_release_exactly_once() -> None:
    m = make()
    m.admit("r1", "ns", toks(1, tail=1))
    with pytest.raises(CacheError, match="already admitted"):
        m.admit("r1", "ns", toks(1, tail=1))
    m.release("r1")
    with pytest.raises(CacheError, match="released twice"):
        m.release("r1")
    with pytest.raises(CacheError):
        m.release("never")
    assert m.usage().free == 32
    m.check_integrity()


def test_commit_must_extend_the_cached_prefix() -> None:
    m = make()
    m.admit("r1", "ns", toks(1, 2, tail=1))
    m.commit("r1", toks(1))
    with pytest.raises(CacheError, match="do not extend"):
        m.commit("r1", toks(9, 2))
    with pytest.raises(CacheError, match="blocks"):
        m.commit("r1", toks(1, 2, 3, 4))
    m.check_integrity()


def test_preempted_request_is_readmitted_with_a_hit() -> None:
    m = make()
    seq = toks(1, 2, tail=1)
    m.admit("r1", "ns", seq)
    m.commit("r1", seq)
    seq += [5, 5, 5]  # decoded three tokens
    m.grow("r1", len(seq))
    m.commit("r1", seq)
    m.release("r1")  # preempted
    back = m.admit("r1", "ns", seq + [6])
    assert back is not None and back.matched_len == 3 * BS
    m.check_integrity()


def test_watermarks() -> None:
    m = make(num_blocks=20, high_watermark=0.5, low_watermark=0.25)
    m.admit("r0", "ns", toks(*range(10), tail=1))
    m.commit("r0", toks(*range(10), tail=1))
    assert m.blocks_to_evict() == 0  # 11 used, pinned: above high but nothing to evict
    m.release("r0")
    assert m.usage().used_fraction == 0.5 and m.blocks_to_evict() == 0  # at high: no trigger
    m.admit("r1", "ns", toks(50, tail=3))  # 2 private blocks: 12 used > 10
    assert m.blocks_to_evict() == 12 - 5
    assert m.evict_to_low_watermark() == 7
    assert m.usage().free == 15 and m.blocks_to_evict() == 0
    m.check_integrity()


def test_reset_refuses_while_pinned() -> None:
    m = make()
    m.admit("r1", "ns", toks(1, tail=1))
    m.commit("r1", toks(1, tail=1))
    with pytest.raises(CacheError, match="referenced"):
        m.reset()
    assert m.reset("other") == 0
    m.release("r1")
    assert m.reset() == 1 and m.usage().free == 32
    m.check_integrity()


def test_disabled_prefix_caching_keeps_everything_private() -> None:
    m = make(enable_prefix_caching=False)
    for rid in ("r1", "r2"):
        a = m.admit(rid, "ns", toks(1, 2, tail=1))
        assert a is not None and a.matched_len == 0
        assert m.commit(rid, toks(1, 2, tail=1)) == 0
    assert m.tree.num_nodes == 0 and m.probe("ns", toks(1, 2, tail=1)) == 0
    m.release("r1")
    m.release("r2")
    assert m.usage().free == 32
    m.check_integrity()


def test_chunked_prefill_allocates_only_the_chunk() -> None:
    m = make()
    a = m.admit("r1", "ns", toks(1, 2, 3, 4, tail=1), num_new_tokens=BS + 1)
    assert a is not None and len(a.block_table) == 2
    with pytest.raises(ValueError):
        m.admit("r2", "ns", toks(1), num_new_tokens=0)
    with pytest.raises(ValueError):
        m.admit("r2", "ns", [])


def test_from_config() -> None:
    cfg = CacheConfig(block_size=None, fork_limit=3, high_watermark=0.8, low_watermark=0.6)
    m = KVCacheManager.from_config(cfg, 100, block_size=16)
    assert (m.block_size, m.tree.fork_limit, m.high_watermark) == (16, 3, 0.8)
    with pytest.raises(ValueError):
        KVCacheManager.from_config(cfg, 100)
    assert KVCacheManager.from_config(CacheConfig(block_size=32), 10, 16).block_size == 32
