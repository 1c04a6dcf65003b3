"""Operator pins: held against eviction storms until their TTL lapses, refreshed on hits,
capped, dropped by reset, and counted by the integrity check."""

from __future__ import annotations

import pytest

from hermes_async.cache import CacheError, KVCacheManager
from hermes_async.cache.pins import PinLimitError
from tests.cache.helpers import BS, Clock, toks


def make(num_blocks: int = 16, max_pinned_blocks: int = 8) -> tuple[KVCacheManager, Clock]:
    wall = Clock()
    m = KVCacheManager(num_blocks, BS, clock=Clock(), max_pinned_blocks=max_pinned_blocks,
                       wall_clock=wall, high_watermark=0.5, low_watermark=0.25)
    return m, wall


def run(m: KVCacheManager, rid: str, ns: str, prompt: list[int], pin_ttl: float | None = None):
    assert m.admit(rid, ns, prompt) is not None
    m.commit(rid, prompt)
    pin = m.pin_request(rid, pin_ttl) if pin_ttl is not None else None
    m.release(rid)
    return pin


def storm(m: KVCacheManager, first: int, n: int) -> None:
    """``n`` disjoint 3-block prompts, each evicting what it must, then the background pass."""
    for i in range(n):
        run(m, f"storm{first + i}", "ns", toks(1000 + 10 * (first + i), 1001 + 10 * (first + i),
                                                1002 + 10 * (first + i), tail=1))
        m.evict_to_low_watermark()


def test_pinned_prefix_survives_an_eviction_storm_then_goes_after_its_ttl() -> None:
    m, wall = make()
    system = toks(1, 2, 3, tail=2)
    pin = run(m, "warm", "ns", system, pin_ttl=10.0)
    assert pin is not None and pin.num_blocks == 3
    storm(m, 0, 20)  # 60 blocks of traffic through a 16-block pool
    assert m.stats().namespaces["ns"].evicted_blocks > 0
    assert m.probe("ns", system) == 3 * BS
    m.check_integrity()
    wall.now = 9.0
    assert m.expire_pins() == 0
    wall.now = 10.0
    assert m.expire_pins() == 1 and m.pins_of() == []
    storm(m, 100, 20)
    assert m.probe("ns", system) == 0  # unpinned: the storm evicted it
    m.check_integrity()


def test_a_hit_on_the_whole_pinned_prefix_restarts_the_ttl() -> None:
    m, wall = make()
    system = toks(1, 2, tail=1)
    pin = run(m, "warm", "ns", system, pin_ttl=10.0)
    wall.now = 8.0
    run(m, "partial", "ns", toks(1, 9, tail=1))  # matches block 1 only: not a hit of the pin
    assert pin.expires_at == 10.0 and pin.hits == 0
    run(m, "hit", "ns", toks(1, 2, 7, tail=1))
    assert pin.expires_at == 18.0 and pin.hits == 1
    wall.now = 12.0
    assert m.expire_pins() == 0
    wall.now = 18.0
    assert m.expire_pins() == 1
    m.check_integrity()


def test_pinning_the_same_path_twice_refreshes_one_pin() -> None:
    m, wall = make()
    system = toks(1, 2, tail=1)
    run(m, "a", "ns", system, pin_ttl=5.0)
    wall.now = 3.0
    again = run(m, "b", "ns", system, pin_ttl=5.0)
    assert len(m.pins_of("ns")) == 1 and again.expires_at == 8.0
    assert m.usage().referenced == 2  # one reference, not two
    m.check_integrity()


def test_pin_cap_counts_shared_prefixes_once_and_refuses_past_it() -> None:
    m, _ = make(num_blocks=32, max_pinned_blocks=4)
    run(m, "a", "ns", toks(1, 2, 3, tail=1), pin_ttl=10)
    run(m, "b", "ns", toks(1, 2, 4, tail=1), pin_ttl=10)  # shares 2 blocks: 4 distinct
    assert m.pins.covered_blocks() == 4
    assert m.admit("c", "ns", toks(1, 5, 6, tail=1)) is not None
    m.commit("c", toks(1, 5, 6, tail=1))
    with pytest.raises(PinLimitError):
        m.pin_request("c", 10)
    m.release("c")
    assert len(m.pins_of()) == 2 and m.pins.covered_blocks() == 4
    m.check_integrity()


def test_pin_prefix_pins_what_is_cached_now() -> None:
    m, _ = make()
    run(m, "a", "ns", toks(1, 2, 3, tail=1))
    pin = m.pin_prefix("ns", toks(1, 2, 9, tail=1), 5)
    assert pin is not None and pin.num_blocks == 2
    assert m.pin_prefix("ns", toks(8, tail=3), 5) is None
    assert m.pin_prefix("other", toks(1, 2, tail=1), 5) is None
    m.check_integrity()


def test_reset_drops_pins_but_refuses_while_a_request_runs_there() -> None:
    m, _ = make()
    run(m, "a", "ns", toks(1, 2, tail=1), pin_ttl=10)
    run(m, "b", "other", toks(1, 2, tail=1), pin_ttl=10)
    run(m, "c", "ns", toks(5, 6, tail=1))
    assert m.admit("busy", "ns", toks(5, 6, tail=1)) is not None  # pins the cached (5, 6)
    with pytest.raises(CacheError, match="referenced blocks in"):
        m.reset("ns")
    assert len(m.pins_of()) == 2  # nothing changed
    m.release("busy")
    assert m.reset("ns") == 4
    assert m.pins_of("ns") == [] and len(m.pins_of("other")) == 1
    m.check_integrity()


def test_integrity_check_sees_a_leaked_pin_reference() -> None:
    m, _ = make()
    pin = run(m, "a", "ns", toks(1, 2, tail=1), pin_ttl=10)
    m.pins.remove(pin)  # forgotten without unlocking: its blocks would be held forever
    with pytest.raises(CacheError, match="operator pins"):
        m.check_integrity()
