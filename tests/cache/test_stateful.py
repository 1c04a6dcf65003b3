"""Random operation sequences against the brute-force reference, integrity after every step.

Tiny blocks (2 tokens) over a two-letter alphabet, a 16-block pool and a fork limit of 2 make
shared prefixes, duplicates, allocation failures, eviction and pruning all frequent.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hermes_async.cache import CacheError, KVCacheManager, TreeNode
from tests.cache.reference import RefCache

BS = 2
NUM_BLOCKS = 24
FORK_LIMIT = 2
HIGH, LOW = 0.8, 0.5
NAMESPACES = st.sampled_from(("a", "b"))
# Prompts start with one of a few shared prefixes, so hits and duplicate inserts are common.
BASES = ((), (0, 0, 0, 0), (0, 0, 1, 1, 0, 1), (0, 0, 0, 1, 1, 1), (1, 0, 1, 0, 1, 1), (1, 1, 0, 0))
PROMPTS = st.builds(lambda base, tail: [*base, *tail], st.sampled_from(BASES),
                    st.lists(st.integers(0, 1), max_size=6)).filter(bool)


def tree_view(mgr: KVCacheManager) -> dict:
    """``(namespace, prefix) -> (ref_count, last_access_time)`` for every node of the tree."""
    out = {}
    for ns, root in mgr.tree.roots().items():
        stack: list[tuple[TreeNode, tuple]] = [(root, ())]
        while stack:
            node, pre = stack.pop()
            for key, child in node.children.items():
                out[(ns, (*pre, key))] = (child.ref_count, child.last_access_time)
                stack.append((child, (*pre, key)))
    return out


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.sut = KVCacheManager(NUM_BLOCKS, BS, high_watermark=HIGH, low_watermark=LOW,
                                  fork_limit=FORK_LIMIT, clock=lambda: self.now)
        self.ref = RefCache(NUM_BLOCKS, BS, FORK_LIMIT, HIGH, LOW)
        self.ids = itertools.count()

    def tick(self) -> None:
        self.now += 1

    def pick(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(sorted(self.ref.reqs)), label="request")

    @rule(ns=NAMESPACES, prompt=PROMPTS, num_new=st.none() | st.integers(1, 12))
    def admit(self, ns: str, prompt: list[int], num_new: int | None) -> None:
        self.tick()
        rid = f"r{next(self.ids)}"
        got = self.sut.admit(rid, ns, prompt, num_new)
        want = self.ref.admit(rid, ns, prompt, num_new, self.now)
        assert (None if got is None else got.matched_len) == want
        if got is not None:
            assert got.matched_len <= len(prompt) - 1
            assert got.block_table == self.sut.block_table(rid)

    @rule(ns=NAMESPACES, prompt=PROMPTS, finish=st.booleans())
    def serve(self, ns: str, prompt: list[int], finish: bool) -> None:
        """The common case: admit a whole prompt, compute all of it, maybe finish at once."""
        self.admit(ns, prompt, None)
        rid = f"r{next(self.ids) - 1}"
        if rid in self.ref.reqs:
            self.commit(rid, len(prompt) - self.ref.reqs[rid].computed)
            if finish:
                self.finish(rid)

    @precondition(lambda self: self.ref.reqs)
    @rule(data=st.data(), all_of_it=st.booleans())
    def compute(self, data: st.DataObject, all_of_it: bool) -> None:
        rid = self.pick(data)
        r = self.ref.reqs[rid]
        room = min(len(r.tokens), r.table_len * BS) - r.computed
        if room > 0:
            self.commit(rid, room if all_of_it else data.draw(st.integers(1, room)))

    def commit(self, rid: str, n: int) -> None:
        self.tick()
        r = self.ref.reqs[rid]
        r.computed += n
        assert self.sut.commit(rid, r.tokens[:r.computed]) == r.computed // BS * BS
        self.ref.commit(rid, self.now)

    @precondition(lambda self: self.ref.reqs)
    @rule(data=st.data(), token=st.integers(0, 1), chunk=st.integers(1, 6))
    def grow(self, data: st.DataObject, token: int, chunk: int) -> None:
        rid = self.pick(data)
        r = self.ref.reqs[rid]
        decode = r.computed == len(r.tokens)  # prompt done: a sampled token joins the sequence
        target = min(len(r.tokens) + decode, r.computed + chunk)
        got = self.sut.grow(rid, target)
        assert (got is not None) == self.ref.grow(rid, target)
        if got is not None and decode:
            r.tokens.append(token)

    @precondition(lambda self: self.ref.reqs)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.finish(self.pick(data))

    def finish(self, rid: str) -> None:
        self.tick()
        self.sut.release(rid)
        self.ref.release(rid, self.now)
        with pytest.raises(CacheError):
            self.sut.release(rid)

    @rule(n=st.integers(0, 6))
    def evict(self, n: int) -> None:
        assert self.sut.evict(n) == self.ref.evict(n)

    @rule()
    def evict_to_low_watermark(self) -> None:
        want = self.ref.blocks_to_evict()
        assert self.sut.blocks_to_evict() == want
        assert self.sut.evict_to_low_watermark() == self.ref.evict(want)

    @rule()
    def prune_forks(self) -> None:
        self.sut.prune_forks()
        self.ref.prune_forks()

    @rule(ns=NAMESPACES, prompt=PROMPTS)
    def probe(self, ns: str, prompt: list[int]) -> None:
        assert self.sut.probe(ns, prompt) == self.ref.longest_match(ns, prompt) * BS

    @rule(ns=NAMESPACES, dice=st.integers(0, 3))
    def reset(self, ns: str, dice: int) -> None:
        if dice:  # a reset empties a namespace: keep it rarer than the other operations
            return
        if self.ref.reset(ns):
            self.sut.reset(ns)
        else:
            with pytest.raises(CacheError):
                self.sut.reset(ns)

    @invariant()
    def matches_reference(self) -> None:
        self.sut.check_integrity()
        want = {k: (e.pins, e.time) for k, e in self.ref.entries.items()}
        assert tree_view(self.sut) == want
        assert self.sut.usage().free == self.ref.free
        for rid, r in self.ref.reqs.items():
            assert self.sut.num_cached_tokens(rid) == r.cached * BS
            assert len(self.sut.block_table(rid)) == r.table_len
        stats = self.sut.stats().namespaces.values()
        assert sum(s.fork_limit_all_referenced for s in stats) == self.ref.all_pinned_events


CacheMachine.TestCase.settings = settings(
    max_examples=500, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_cache_against_reference = CacheMachine.TestCase
