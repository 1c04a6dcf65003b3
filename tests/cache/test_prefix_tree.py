from __future__ import annotations

import pytest

from hermes_async.cache import CacheError, PrefixTree
from tests.cache.helpers import BS, Clock, toks


def make(fork_limit: int | None = None) -> tuple[PrefixTree, Clock]:
    clock = Clock()
    return PrefixTree(BS, fork_limit=fork_limit, clock=clock), clock


def test_match_never_covers_the_whole_prompt() -> None:
    tree, _ = make()
    tree.insert("ns", toks(1, 2), [10, 11])
    assert tree.match("ns", toks(1, 2)).matched_len == BS  # the last token is left to compute
    assert tree.match("ns", toks(1, 2, tail=1)).matched_len == 2 * BS
    assert tree.match("ns", toks(1)).matched_len == 0
    assert tree.match("ns", toks(1, tail=1)).matched_len == BS
    assert tree.match("ns", []).matched_len == 0
    tree.check_integrity()


def test_match_is_greedy_and_stops_at_first_miss() -> None:
    tree, _ = make()
    tree.insert("ns", toks(1, 2, 3), [10, 11, 12])
    m = tree.match("ns", toks(1, 9, 3, tail=1))
    assert m.matched_len == BS and [n.block_id for n in m.path] == [10]
    assert m.last_node is m.path[-1]
    miss = tree.match("ns", toks(9, tail=1))
    assert miss.matched_len == 0 and miss.path == () and miss.last_node is tree.roots()["ns"]
    assert tree.match("other", toks(1, tail=1)).last_node is None


def test_namespaces_never_share_nodes() -> None:
    tree, _ = make()
    tree.insert("a", toks(1, 2), [10, 11])
    assert tree.match("b", toks(1, 2, tail=1)).matched_len == 0
    res = tree.insert("b", toks(1, 2), [20, 21])
    assert res.num_new == 2 and res.duplicate_block_ids == ()
    assert [n.block_id for n in tree.match("b", toks(1, 2, tail=1)).path] == [20, 21]
    assert sorted(tree.reset("a")) == [10, 11]
    assert tree.match("b", toks(1, 2, tail=1)).matched_len == 2 * BS
    tree.check_integrity()


def test_insert_duplicate_contract() -> None:
    tree, _ = make()
    tree.insert("ns", toks(1, 2), [10, 11])
    res = tree.insert("ns", toks(1, 2, 3), [50, 51, 52])  # a racing request computed 1, 2 too
    assert [n.block_id for n in res.path] == [10, 11, 52]
    assert res.duplicate_block_ids == (50, 51) and res.num_new == 1
    assert tree.node_for_block(50) is None and tree.node_for_block(52) is res.last_node
    again = tree.insert("ns", toks(1, 2, 3), [10, 11, 52])  # its own blocks: no duplicates
    assert again.duplicate_block_ids == () and again.num_new == 0
    tree.check_integrity()


def test_insert_rejects_bad_input_without_changing_anything() -> None:
    tree, _ = make()
    tree.insert("ns", toks(1), [10])
    with pytest.raises(ValueError):
        tree.insert("ns", toks(2, tail=1), [11])
    with pytest.raises(CacheError, match="already belongs"):
        tree.insert("ns", toks(5, 6), [12, 10])
    with pytest.raises(CacheError, match="twice"):
        tree.insert("ns", toks(5, 6), [12, 12])
    assert tree.num_nodes == 1
    tree.check_integrity()


def test_insert_below_a_parent_continues_its_path() -> None:
    tree, _ = make()
    first = tree.insert("ns", toks(1), [10])
    tree.insert("ns", toks(2), [11], parent=first.last_node)
    assert tree.match("ns", toks(1, 2, tail=1)).matched_len == 2 * BS
    with pytest.raises(CacheError):
        tree.insert("other", toks(3), [12], parent=first.last_node)


def test_evicts_least_recently_used_first_and_parents_become_evictable() -> None:
    tree, clock = make()
    clock.advance()
    tree.insert("ns", toks(1, 2), [10, 11])  # t1
    clock.advance()
    tree.insert("ns", toks(3), [12])  # t2
    clock.advance()
    tree.insert("ns", toks(4), [13])  # t3
    clock.advance()
    tree.match("ns", toks(3, tail=1))  # 12 used at t4
    assert tree.num_evictable == 3  # 11, 12, 13; 10 is not a leaf
    assert tree.evict(2) == [11, 10]  # 10 became evictable the moment 11 left
    assert tree.evict(1) == [13]
    assert tree.evict(5) == [12]
    assert tree.num_nodes == 0
    tree.check_integrity()


def test_pinned_path_survives_any_eviction_pressure() -> None:
    tree, _ = make()
    res = tree.insert("ns", toks(1, 2, 3), [10, 11, 12])
    tree.insert("ns", toks(1, 7), [10, 20])
    tree.lock(res.last_node)
    assert tree.evict(10**6) == [20]
    assert tree.match("ns", toks(1, 2, 3, tail=1)).matched_len == 3 * BS
    tree.unlock(res.last_node)
    assert sorted(tree.evict(10**6)) == [10, 11, 12]
    tree.check_integrity()


def test_lock_and_unlock_exactly_once() -> None:
    tree, _ = make()
    a = tree.insert("ns", toks(1), [10]).last_node
    b = tree.insert("ns", toks(2), [11], parent=a).last_node
    tree.lock(a)
    tree.lock(b, stop=a)  # the path grew: pin only the new part
    assert (a.ref_count, b.ref_count, tree.num_referenced) == (1, 1, 2)
    other = tree.insert("ns", toks(9), [12]).last_node
    with pytest.raises(CacheError, match="not an ancestor"):
        tree.lock(b, stop=other)
    tree.unlock(b)
    assert tree.num_referenced == 0
    with pytest.raises(CacheError, match="unreferenced"):
        tree.unlock(b)
    tree.check_integrity()


def test_fork_limit_prunes_the_least_recently_used_unpinned_subtree() -> None:
    tree, clock = make(fork_limit=2)
    clock.advance()
    a = tree.insert("ns", toks(1), [10]).last_node  # t1: oldest, but pinned
    tree.lock(a)
    clock.advance()
    tree.insert("ns", toks(2, 5), [11, 15])  # t2
    clock.advance()
    res = tree.insert("ns", toks(3), [12])  # t3: root full -> LRU unpinned subtree {11, 15}
    assert sorted(res.pruned_block_ids) == [11, 15]
    assert tree.match("ns", toks(2, tail=1)).matched_len == 0
    assert tree.match("ns", toks(1, tail=1)).matched_len == BS
    clock.advance()
    tree.insert("ns", toks(6), [16])  # t4: prunes 12
    clock.advance()
    tree.match("ns", toks(6, tail=1))  # 16 used at t5
    clock.advance()
    tree.unlock(a)  # a released at t6: now the most recently used
    clock.advance()
    assert tree.insert("ns", toks(7), [17]).pruned_block_ids == (16,)
    assert sorted(n.token_ids[0] for n in tree.roots()["ns"].children.values()) == [1, 7]
    st = tree.stats()["ns"]
    assert (st.pruned_subtrees, st.pruned_blocks) == (3, 4)
    tree.check_integrity()


def test_fork_limit_with_every_child_pinned_still_inserts_and_counts() -> None:
    tree, clock = make(fork_limit=2)
    a = tree.insert("ns", toks(1), [10]).last_node
    b = tree.insert("ns", toks(2), [11]).last_node
    tree.lock(a)
    tree.lock(b)
    clock.advance()
    res = tree.insert("ns", toks(3), [12])
    assert res.num_new == 1 and res.pruned_block_ids == ()
    assert tree.stats()["ns"].fork_limit_all_referenced == 1
    assert tree.over_limit_nodes() == [tree.roots()["ns"]]
    tree.check_integrity()
    clock.advance()
    tree.unlock(a)  # a used at t2, 12 inserted at t1: 12 is the LRU unpinned child
    assert tree.prune_forks() == [12]
    assert tree.over_limit_nodes() == []
    tree.check_integrity()


def test_reset_refuses_while_pinned_and_keeps_counters() -> None:
    tree, _ = make()
    node = tree.insert("ns", toks(1, 2), [10, 11]).last_node
    tree.match("ns", toks(1, 2, tail=1))
    tree.lock(node)
    with pytest.raises(CacheError, match="referenced"):
        tree.reset()
    assert tree.num_nodes == 2
    tree.unlock(node)
    assert sorted(tree.reset()) == [10, 11]
    st = tree.stats()["ns"]
    assert (st.blocks, st.referenced_blocks) == (0, 0)
    assert tree.roots() == {} and not node.live
    tree.check_integrity()


def test_stats_count_inserted_blocks_not_queries() -> None:
    tree, _ = make()
    tree.insert("ns", toks(1, 2), [10, 11])
    tree.match("ns", toks(1, 2, tail=2))
    st = tree.stats()["ns"]  # hits are counted once, by the engine's cache observer
    assert st.inserted_blocks == 2 and st.blocks == 2


def test_touch_of_a_stale_match_is_refused() -> None:
    tree, _ = make()
    tree.insert("ns", toks(1), [10])
    m = tree.match("ns", toks(1, tail=1), touch=False)
    tree.evict(1)
    with pytest.raises(CacheError, match="stale"):
        tree.touch(m)


def test_default_clock_is_logical_and_bad_settings_are_refused() -> None:
    tree = PrefixTree(BS)
    tree.insert("ns", toks(1), [10])
    tree.insert("ns", toks(2), [11])
    assert tree.evict(1) == [10]
    with pytest.raises(ValueError):
        PrefixTree(0)
    with pytest.raises(ValueError):
        PrefixTree(BS, fork_limit=0)
