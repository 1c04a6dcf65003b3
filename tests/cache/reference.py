"""Brute-force model of KVCacheManager for the stateful test.

Cached blocks are explicit ``(namespace, prefix)`` keys, ``prefix`` being a tuple of token
blocks from the start of a sequence; every question (longest match, leaves, children, LRU
victim) is answered by scanning all keys. Slow and obviously right: that is the point.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

Key = tuple[str, tuple[tuple[int, ...], ...]]


@dataclass
class Entry:
    time: float
    seq: int  # creation order, the tie-break of equal times
    pins: int = 0


@dataclass
class Req:
    namespace: str
    tokens: list[int]
    computed: int
    table_len: int
    cached: int  # blocks of the request in the tree (pinned by it)


class RefCache:
    def __init__(self, num_blocks: int, block_size: int, fork_limit: int | None,
                 high: float, low: float) -> None:
        self.total, self.bs, self.fork_limit = num_blocks, block_size, fork_limit
        self.high, self.low = high, low
        self.entries: dict[Key, Entry] = {}
        self.reqs: dict[str, Req] = {}
        self._seq = itertools.count()
        self.all_pinned_events = 0

    # ----- questions -----------------------------------------------------------------------
    def blocks(self, tokens: list[int], n: int) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(tokens[i * self.bs:(i + 1) * self.bs]) for i in range(n))

    def longest_match(self, ns: str, tokens: list[int]) -> int:
        """Longest full-block prefix over all cached sequences of ``ns``, in blocks."""
        limit = (len(tokens) - 1) // self.bs
        want = self.blocks(tokens, limit)
        best = 0
        for ens, pre in self.entries:
            if ens == ns:
                k = 0
                while k < min(len(pre), limit) and pre[k] == want[k]:
                    k += 1
                best = max(best, k)
        return best

    def children(self, key: Key) -> list[Key]:
        ns, pre = key
        return [k for k in self.entries
                if k[0] == ns and len(k[1]) == len(pre) + 1 and k[1][:-1] == pre]

    @property
    def free(self) -> int:
        private = sum(r.table_len - r.cached for r in self.reqs.values())
        return self.total - len(self.entries) - private

    @property
    def unpinned(self) -> int:
        return sum(1 for e in self.entries.values() if e.pins == 0)

    def chain(self, r: Req) -> list[Key]:
        pre = self.blocks(r.tokens, r.cached)
        return [(r.namespace, pre[:i]) for i in range(1, r.cached + 1)]

    def lru(self, keys: list[Key]) -> Key | None:
        cands = [k for k in keys if self.entries[k].pins == 0]
        return min(cands, key=lambda k: (self.entries[k].time, self.entries[k].seq), default=None)

    # ----- operations, mirroring the manager's -----------------------------------------------
    def evict(self, n: int) -> int:
        done = 0
        while done < n:
            victim = self.lru([k for k in self.entries if not self.children(k)])
            if victim is None:
                break
            del self.entries[victim]
            done += 1
        return done

    def admit(self, rid: str, ns: str, prompt: list[int], num_new: int | None,
              now: float) -> int | None:
        k = self.longest_match(ns, prompt)
        matched = k * self.bs
        rest = len(prompt) - matched
        want = rest if num_new is None else min(num_new, rest)
        need = math.ceil((matched + want) / self.bs) - k
        r = Req(ns, list(prompt), matched, k + need, k)
        chain = self.chain(r)
        if need > self.free + self.unpinned - sum(self.entries[c].pins == 0 for c in chain):
            return None
        for c in chain:
            self.entries[c].time = now
            self.entries[c].pins += 1
        self.evict(need - self.free)
        self.reqs[rid] = r
        return matched

    def grow(self, rid: str, num_tokens: int) -> bool:
        r = self.reqs[rid]
        need = math.ceil(num_tokens / self.bs) - r.table_len
        if need <= 0:
            return True
        if need > self.free + self.unpinned:
            return False
        self.evict(need - self.free)
        r.table_len += need
        return True

    def commit(self, rid: str, now: float) -> None:
        r = self.reqs[rid]
        full = r.computed // self.bs
        if full <= r.cached:
            return
        pre = self.blocks(r.tokens, full)
        keys = [(r.namespace, pre[:i]) for i in range(r.cached + 1, full + 1)]
        fresh = [k for k in keys if k not in self.entries]
        for k in keys:
            if k in self.entries:
                self.entries[k].time = now
        if fresh and self.fork_limit is not None:
            branch = (r.namespace, fresh[0][1][:-1])
            self.all_pinned_events += not self.prune_children(branch, self.fork_limit - 1)
        for k in fresh:
            self.entries[k] = Entry(now, next(self._seq))
        for k in keys:
            self.entries[k].pins += 1
        r.cached = full

    def prune_children(self, key: Key, keep: int) -> bool:
        """Drop LRU unpinned child subtrees; False if it had to stop with all children pinned."""
        while len(kids := self.children(key)) > keep:
            victim = self.lru(kids)
            if victim is None:
                return False
            ns, pre = victim
            for k in [k for k in self.entries if k[0] == ns and k[1][:len(pre)] == pre]:
                del self.entries[k]
        return True

    def prune_forks(self) -> None:
        if self.fork_limit is None:
            return
        parents = {(ns, pre[:-1]) for ns, pre in self.entries}
        for key in sorted(parents, key=lambda k: len(k[1])):
            if key[1] == () or key in self.entries:
                self.prune_children(key, self.fork_limit)

    def release(self, rid: str, now: float) -> None:
        r = self.reqs.pop(rid)
        for c in self.chain(r):
            self.entries[c].pins -= 1
            self.entries[c].time = now

    def blocks_to_evict(self) -> int:
        used = self.total - self.free
        if used <= self.high * self.total:
            return 0
        return min(used - math.floor(self.low * self.total), self.unpinned)

    def reset(self, ns: str) -> bool:
        if any(e.pins for k, e in self.entries.items() if k[0] == ns):
            return False
        for k in [k for k in self.entries if k[0] == ns]:
            del self.entries[k]
        return True
