"""KV cache manager: the block pool and the prefix tree, per request, for the engine.

Per request, on the event loop that owns the cache (no locks; nothing here awaits):

1. ``admit(rid, namespace, prompt, num_new_tokens)`` -> :class:`Admission` or None: matches the
   prompt, references the matched path, allocates private blocks for the tokens to compute
   (evicting unreferenced cached blocks if it must). None means "not now" and changes nothing.
2. ``grow(rid, num_tokens)`` before each later step: room for ``num_tokens`` tokens in total.
3. ``commit(rid, computed_token_ids)`` after each step: newly full blocks move from private to
   the tree and are referenced by it. A block another request cached first is freed and the
   request's table switches to the cached copy, so read ``block_table(rid)`` again before the
   next step.
4. ``release(rid)`` once, on finish, abort or preemption: drops its references, frees private
   blocks; its cached blocks stay in the tree (unreferenced) for later hits, e.g. the re-admitted
   request.

``block_table(rid)`` is the runner's block table: tree blocks of the matched and committed path,
then private blocks, in token order. Between steps a background task calls
``evict_to_low_watermark()``, ``prune_forks()``, ``expire_pins()`` and ``finish_loads()``.

With a disk tier (:meth:`attach_disk`, :mod:`hermes_async.cache.disk_link`), evicted blocks
are written to disk, and ``prepare(rid, namespace, prompt)`` before ``admit`` loads the blocks
of a prompt found there (None while they load: try again later).

Operator pins (``pin_request``/``pin_prefix``) hold a cached prefix like a running request would,
for ``ttl_s`` seconds of ``wall_clock`` that restart whenever a request's match covers the whole
pinned prefix; at most ``max_pinned_blocks`` distinct blocks are held by pins.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from hermes_async.cache.block_pool import BlockPool
from hermes_async.cache.disk_link import DiskLink
from hermes_async.cache.disk_tier import DiskTier
from hermes_async.cache.errors import CacheError
from hermes_async.cache.integrity import check_manager
from hermes_async.cache.pins import Pin, PinTable
from hermes_async.cache.prefix_tree import PrefixTree
from hermes_async.cache.structs import (
    Admission,
    CacheStats,
    CacheUsage,
    RequestState,
    TreeNode,
)
from hermes_async.config import CacheConfig


class KVCacheManager:
    """Block pool + prefix tree + the blocks each running request holds.

    With ``enable_prefix_caching=False`` nothing is matched or inserted: every block a request
    uses is private and freed on release.
    """

    def __init__(self, num_blocks: int, block_size: int, *, high_watermark: float = 0.90,
                 low_watermark: float = 0.75, fork_limit: int | None = 64,
                 enable_prefix_caching: bool = True,
                 clock: Callable[[], float] | None = None,
                 max_pinned_blocks: int | None = None,
                 wall_clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 < low_watermark <= high_watermark <= 1.0:
            raise ValueError("watermarks need 0 < low_watermark <= high_watermark <= 1")
        self.pool = BlockPool(num_blocks)
        self.tree = PrefixTree(block_size, fork_limit=fork_limit, clock=clock)
        self.block_size = block_size
        self.high_watermark = high_watermark
        self.low_watermark = low_watermark
        self.enable_prefix_caching = enable_prefix_caching
        self._requests: dict[str, RequestState] = {}
        self._allocation_failures = 0
        self.pins = PinTable(num_blocks // 2 if max_pinned_blocks is None else max_pinned_blocks)
        self._wall_clock = wall_clock
        self.disk: DiskLink | None = None

    def attach_disk(self, tier: DiskTier, *, write_through: bool = False) -> None:
        """Put ``tier`` under the tree: evicted blocks are written to it (``write_through``:
        every block as soon as it is cached), and :meth:`prepare` loads matching ones back
        before admission."""
        if self.enable_prefix_caching:
            self.disk = DiskLink(tier, self.tree, self.pool, self._requests, self._allocate)
            self.disk.write_through = write_through

    @classmethod
    def from_config(cls, config: CacheConfig, num_blocks: int, block_size: int | None = None,
                    *, clock: Callable[[], float] | None = None) -> KVCacheManager:
        """Build from ``[cache]``; ``block_size`` is the derived one when the config has none."""
        size = config.block_size or block_size
        if size is None:
            raise ValueError("block_size is neither configured nor given (derive it first)")
        return cls(num_blocks, size, high_watermark=config.high_watermark,
                   low_watermark=config.low_watermark, fork_limit=config.fork_limit,
                   enable_prefix_caching=config.enable_prefix_caching, clock=clock,
                   max_pinned_blocks=math.floor(config.max_pinned_fraction * num_blocks))

    # ----- per request ------------------------------------------------------------------------
    def probe(self, namespace: str, token_ids: Sequence[int]) -> int:
        """Tokens a request with this prompt would find cached now; changes nothing."""
        if not self.enable_prefix_caching:
            return 0
        return self.tree.match(namespace, token_ids, touch=False).matched_len

    def prepare(self, request_id: str, namespace: str,
                prompt_token_ids: Sequence[int]) -> int | None:
        """Before :meth:`admit`: None while blocks of the prompt load from the disk tier (ask
        again on a later step); else the request can be admitted now, and the answer is the
        tokens loaded from disk for it (always 0 without a disk tier)."""
        return 0 if self.disk is None else self.disk.prepare(request_id, namespace,
                                                             prompt_token_ids)

    def forget(self, request_id: str) -> None:
        """A waiting request left (abort, failure) without being admitted."""
        if self.disk is not None:
            self.disk.forget(request_id)

    @property
    def num_loading(self) -> int:
        """Loads from the disk tier in flight."""
        return 0 if self.disk is None else self.disk.num_loading

    def loads_finished(self) -> bool:
        """Whether a disk load is done and waits to join the tree (the next plan takes it)."""
        return self.disk is not None and self.disk.has_finished()

    def admit(self, request_id: str, namespace: str, prompt_token_ids: Sequence[int],
              num_new_tokens: int | None = None) -> Admission | None:
        """Match, reference and allocate for a new (or re-admitted) request.

        Makes room for ``matched_len + num_new_tokens`` tokens; ``num_new_tokens`` is clamped to
        the rest of the prompt (default: all of it). Returns None, with no side effect (no
        statistics, no LRU change), when free plus evictable blocks are not enough.
        """
        if request_id in self._requests:
            raise CacheError(f"request {request_id!r} is already admitted")
        if not prompt_token_ids:
            raise ValueError("cannot admit an empty prompt")
        if num_new_tokens is not None and num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be at least 1, not {num_new_tokens}")
        bs = self.block_size
        m = None
        if self.enable_prefix_caching:
            m = self.tree.match(namespace, prompt_token_ids, touch=False)
        path = m.path if m is not None else ()
        matched = len(path) * bs
        rest = len(prompt_token_ids) - matched
        want = rest if num_new_tokens is None else min(num_new_tokens, rest)
        need = math.ceil((matched + want) / bs) - len(path)
        newly_referenced = sum(1 for nd in path if nd.ref_count == 0)
        if need > self.pool.num_free + self.tree.num_unreferenced - newly_referenced:
            self._allocation_failures += 1
            return None
        if m is not None:
            self.tree.touch(m)
            if path:
                self.tree.lock(path[-1])
                self.pins.refresh_on_hit(path, self._wall_clock())
        blocks = self._allocate(need)
        state = RequestState(request_id, namespace, matched, [nd.block_id for nd in path] + blocks,
                             len(path), path[-1] if path else None)  # type: ignore[arg-type]
        self._requests[request_id] = state
        return Admission(matched, list(state.block_table))

    def grow(self, request_id: str, num_tokens: int) -> list[int] | None:
        """Make the block table cover ``num_tokens`` tokens in total; return the added blocks.

        Returns None, changing nothing, when the blocks cannot be had (preempt something).
        """
        st = self._state(request_id)
        need = math.ceil(num_tokens / self.block_size) - len(st.block_table)
        if need <= 0:
            return []
        if need > self.pool.num_free + self.tree.num_unreferenced:
            self._allocation_failures += 1
            return None
        blocks = self._allocate(need)
        st.block_table.extend(blocks)
        return blocks

    def commit(self, request_id: str, token_ids: Sequence[int]) -> int:
        """Cache the full blocks of ``token_ids``, the request's tokens whose KV is computed.

        Newly full blocks go into the tree below the request's path and are referenced by it.
        Where another request cached the same block first, this request's copy is freed and
        its block table points at the cached block instead (safe once the step that wrote the
        copy is over). Returns the request's cached length in tokens.
        """
        st = self._state(request_id)
        if not self.enable_prefix_caching:
            return 0
        bs, c = self.block_size, st.num_cached_blocks
        full = len(token_ids) // bs
        if full > len(st.block_table):
            raise CacheError(f"request {request_id!r}: {len(token_ids)} computed tokens but "
                             f"only {len(st.block_table)} blocks")
        if full <= c:
            return c * bs
        last = st.last_node
        if last is not None and tuple(token_ids[(c - 1) * bs:c * bs]) != last.token_ids:
            raise CacheError(f"request {request_id!r}: token_ids do not extend its cached prefix")
        res = self.tree.insert(st.namespace, token_ids[c * bs:full * bs],
                               st.block_table[c:full], parent=last)
        self.tree.lock(res.last_node, stop=last)
        if self.disk is not None and self.disk.write_through and res.num_new:
            self.disk.spill(res.path[len(res.path) - res.num_new:])
        to_free = list(res.pruned_block_ids)
        for i, node in enumerate(res.path, start=c):
            if st.block_table[i] != node.block_id:
                to_free.append(st.block_table[i])
                st.block_table[i] = node.block_id  # type: ignore[assignment]
        self.pool.free(to_free)
        st.num_cached_blocks, st.last_node = full, res.last_node
        return full * bs

    def release(self, request_id: str) -> None:
        """Drop the request's references on its path and free its private blocks; exactly once
        per admission."""
        st = self._requests.get(request_id)
        if st is None:
            raise CacheError(f"request {request_id!r} is not held (released twice, or never "
                             "admitted)")
        if st.last_node is not None:
            self.tree.unlock(st.last_node)
        self.pool.free(st.block_table[st.num_cached_blocks:])
        del self._requests[request_id]

    def block_table(self, request_id: str) -> list[int]:
        """Copy of the request's physical block ids in token order."""
        return list(self._state(request_id).block_table)

    def num_cached_tokens(self, request_id: str) -> int:
        """Tokens of the request that sit in the tree (matched plus committed)."""
        return self._state(request_id).num_cached_blocks * self.block_size

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    # ----- operator pins ---------------------------------------------------------------------
    def pin_request(self, request_id: str, ttl_s: float) -> Pin | None:
        """Pin the cached path of a running request (before its release) for ``ttl_s``.

        Returns the pin (an existing pin of the same path gets its deadline restarted), or
        None when the request has nothing cached. Raises
        :class:`~hermes_async.cache.pins.PinLimitError` past the cap, changing nothing.
        """
        st = self._state(request_id)
        if st.last_node is None:
            return None
        return self._pin(st.namespace, st.last_node, st.num_cached_blocks, ttl_s)

    def pin_prefix(self, namespace: str, token_ids: Sequence[int], ttl_s: float) -> Pin | None:
        """Pin the longest cached prefix of ``token_ids`` (as a request would match it)."""
        if not self.enable_prefix_caching:
            return None
        m = self.tree.match(namespace, token_ids, touch=False)
        if not m.path:
            return None
        return self._pin(namespace, m.path[-1], len(m.path), ttl_s)

    def unpin(self, pin: Pin) -> None:
        """Drop a pin now; its blocks stay cached (evictable once nothing else pins them)."""
        self.pins.remove(pin)
        self.tree.unlock(pin.node)

    def expire_pins(self) -> int:
        """The background pass over pins: drop those past their deadline; returns how many."""
        expired = self.pins.expired(self._wall_clock())
        for pin in expired:
            self.unpin(pin)
        return len(expired)

    def pins_of(self, namespace: str | None = None) -> list[Pin]:
        """The pins of one namespace (or all)."""
        return self.pins.in_namespace(namespace)

    def now(self) -> float:
        """The clock pins' deadlines are in."""
        return self._wall_clock()

    def _pin(self, namespace: str, node: TreeNode, num_blocks: int, ttl_s: float) -> Pin:
        if ttl_s <= 0:
            raise ValueError(f"pin ttl_s must be positive, not {ttl_s}")
        now = self._wall_clock()
        pin = self.pins.get(node)
        if pin is not None:
            pin.ttl_s, pin.expires_at = ttl_s, now + ttl_s
            return pin
        pin = Pin(namespace, node, num_blocks, ttl_s, now + ttl_s)
        self.pins.add(pin)
        self.tree.lock(node)
        return pin

    # ----- background work, figures, maintenance ----------------------------------------------
    def usage(self) -> CacheUsage:
        free, in_tree, held = self.pool.num_free, self.tree.num_nodes, self.tree.num_referenced
        private = self.pool.num_blocks - free - in_tree
        return CacheUsage(self.pool.num_blocks, free, in_tree - held, held, private,
                          self.pins.covered_blocks())

    def blocks_to_evict(self) -> int:
        """Blocks to evict now: 0 unless usage is above the high watermark, then enough to get
        to the low watermark (or every unreferenced cached block, if that is not enough)."""
        total, used = self.pool.num_blocks, self.pool.num_used
        if used <= self.high_watermark * total:
            return 0
        return min(used - math.floor(self.low_watermark * total), self.tree.num_unreferenced)

    def evict(self, n_blocks: int) -> int:
        """Evict up to ``n_blocks`` LRU unreferenced cached blocks into the free list (with a
        disk tier, their KV is copied out for it first)."""
        if self.disk is None:
            freed = self.tree.evict(n_blocks)
        else:
            nodes: list[TreeNode] = []
            freed = self.tree.evict(n_blocks, nodes)
            self.disk.spill(nodes)
        self.pool.free(freed)
        return len(freed)

    def evict_to_low_watermark(self) -> int:
        """The background eviction pass; returns the blocks freed. With a disk tier it evicts
        no more than the tier's write backlog has room for (the next passes go on as the
        writes drain), so background eviction never drops a block it could have written;
        eviction for an allocation that needs blocks now is not held back."""
        n = self.blocks_to_evict()
        if n and self.disk is not None and self.disk.tier.enabled:
            n = min(n, self.disk.tier.backlog_room())
        return self.evict(n)

    def prune_forks(self) -> int:
        """The background fork-limit pass; returns the blocks freed."""
        freed = self.tree.prune_forks()
        self.pool.free(freed)
        return len(freed)

    def stats(self) -> CacheStats:
        return CacheStats(self.usage(), self.tree.stats(), self._allocation_failures)

    def reset(self, namespace: str | None = None) -> int:
        """Drop the cached blocks and the operator pins of one namespace (or all); refuses,
        changing nothing, while a running request references blocks there."""
        loading = self.disk.loading_namespaces() if self.disk is not None else set()
        busy = sorted({st.namespace for st in self._requests.values()
                       if st.last_node is not None
                       and (namespace is None or st.namespace == namespace)}
                      | {ns for ns in loading if namespace is None or ns == namespace})
        if busy:
            raise CacheError("reset refused while running requests hold referenced blocks in "
                             f"{busy}")
        for pin in self.pins.in_namespace(namespace):
            self.unpin(pin)
        freed = self.tree.reset(namespace)
        self.pool.free(freed)
        if self.disk is not None:
            self.disk.tier.remove(namespace)
        return len(freed)

    def close_disk(self, timeout_s: float) -> None:
        """A clean shutdown: finish the loads, write the cached blocks not on disk yet and the
        queued writes, within about ``timeout_s``; then stop the tier's threads."""
        if self.disk is None:
            return
        deadline = time.monotonic() + timeout_s
        self.disk.wait_all(timeout_s)
        self.disk.save_all(max(0.0, deadline - time.monotonic()))
        self.disk.tier.close(max(0.0, deadline - time.monotonic()))

    def disk_stats(self) -> dict[str, object] | None:
        """The disk tier's figures (``/cache/stats`` ``disk``), None without a tier."""
        if self.disk is None:
            return None
        tier = self.disk.tier
        return {"dir": str(tier.root), **tier.stats().as_dict(),
                "hit_requests": self.disk.hit_requests,
                "hit_tokens": self.disk.hit_blocks * self.block_size,
                "loading": self.disk.num_loading}

    def finish_loads(self) -> int:
        """The background pass over disk loads: put finished ones into the tree."""
        return 0 if self.disk is None else self.disk.finish_done()

    def check_integrity(self) -> None:
        """Raise :class:`IntegrityError` unless pool, tree and requests agree (full walk)."""
        check_manager(self.pool, self.tree, self._requests, [p.node for p in self.pins])

    def _state(self, request_id: str) -> RequestState:
        st = self._requests.get(request_id)
        if st is None:
            raise CacheError(f"request {request_id!r} is not held")
        return st

    def _allocate(self, n: int) -> list[int]:
        """Allocate ``n`` blocks, evicting first if needed; the caller checked feasibility."""
        short = n - self.pool.num_free
        if short > 0:
            self.evict(short)
        blocks = self.pool.allocate(n)
        if blocks is None:
            raise CacheError(f"{n} blocks checked available but not allocatable")
        return blocks
