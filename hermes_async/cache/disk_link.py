"""The prefix tree's link to the disk tier: spill on eviction, load back before admission.

Owned by :class:`~hermes_async.cache.manager.KVCacheManager` (same loop, no locks); the tier's
threads never touch the tree or the pool.

- **Spill**: a node leaving the tree by eviction hands its block to :meth:`DiskLink.spill`,
  which copies the KV out (the tier writes the file in its thread) before the block is freed.
- **Load**: :meth:`DiskLink.prepare` runs before a request's admission. When blocks past its
  pool match are on disk, it references the matched path, allocates pool blocks for them and
  queues a :class:`~hermes_async.cache.disk_tier.LoadJob`; the load is held like a request
  (``RequestState`` under ``<request id>\\x00disk``: the integrity checks and the usage figures
  see its blocks as private). Until the job is done the request waits (``prepare`` answers
  None); then the loaded blocks join the tree below the path and the request is admitted at
  the full matched length. A load that came back short (a corrupt or missing file) is a miss
  for the rest: those tokens are computed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from hermes_async.cache.block_pool import BlockPool
from hermes_async.cache.digest import chain_digest, namespace_seed
from hermes_async.cache.disk_tier import DiskTier, LoadJob
from hermes_async.cache.prefix_tree import PrefixTree
from hermes_async.cache.structs import RequestState, TreeNode

LOAD_SUFFIX = "\x00disk"


class DiskLink:
    """Spills and loads between one manager's tree/pool and a :class:`DiskTier`."""

    def __init__(self, tier: DiskTier, tree: PrefixTree, pool: BlockPool,
                 requests: dict[str, RequestState],
                 allocate: Callable[[int], list[int]]) -> None:
        self.tier = tier
        self._tree, self._pool, self._requests = tree, pool, requests
        self._allocate = allocate
        self._loads: dict[str, LoadJob] = {}
        self._finished: dict[str, int] = {}  # request -> tokens loaded, not admitted yet
        self._abandoned: set[str] = set()  # loads running for requests that left
        self.write_through = False  # also write each block when it is cached (shared dirs)
        self.hit_blocks = 0  # blocks loaded back for requests (tier-2 hits)
        self.hit_requests = 0

    # ----- digests --------------------------------------------------------------------------
    def digest(self, node: TreeNode) -> bytes:
        """``node``'s chained digest (cached on the nodes of its path)."""
        chain = []
        nd: TreeNode | None = node
        while nd is not None and nd.digest is None:
            chain.append(nd)
            nd = nd.parent
        prev = nd.digest if nd is not None else None
        for nd in reversed(chain):
            if nd.is_root:
                nd.digest = namespace_seed(nd.namespace)
            else:
                nd.digest = chain_digest(prev if prev is not None
                                         else namespace_seed(nd.namespace), nd.token_ids)
            prev = nd.digest
        assert node.digest is not None
        return node.digest

    # ----- spill ----------------------------------------------------------------------------
    def spill(self, nodes: Sequence[TreeNode]) -> int:
        """Queue the blocks of ``nodes`` (leaving the pool now) for the disk; returns how many."""
        if not self.tier.enabled:
            return 0
        by_ns: dict[str, list[tuple[bytes, tuple[int, ...], int]]] = {}
        for nd in nodes:
            by_ns.setdefault(nd.namespace, []).append(
                (self.digest(nd), nd.token_ids, nd.block_id))  # type: ignore[arg-type]
        return sum(self.tier.spill(ns, items) for ns, items in by_ns.items())

    # ----- load -----------------------------------------------------------------------------
    @property
    def num_loading(self) -> int:
        return len(self._loads)

    def has_finished(self) -> bool:
        return any(job.done.is_set() for job in self._loads.values())

    def loading_namespaces(self) -> set[str]:
        return {job.namespace for job in self._loads.values()}

    def prepare(self, request_id: str, namespace: str, token_ids: Sequence[int]) -> int | None:
        """None while the request's blocks load; else it can be admitted now, and the answer is
        the tokens loaded from disk for it (0: none)."""
        self.finish_done()
        if request_id in self._loads:
            return None
        if request_id in self._finished:
            return self._finished.pop(request_id)
        if not self.tier.enabled:
            return 0
        bs = self._tree.block_size
        m = self._tree.match(namespace, token_ids, touch=False)
        limit = (len(token_ids) - 1) // bs
        start = len(m.path)
        if start >= limit:
            return 0
        prev = self.digest(m.last_node) if m.last_node is not None else namespace_seed(namespace)
        digests: list[bytes] = []
        blocks: list[tuple[int, ...]] = []
        for i in range(start, limit):
            block = tuple(token_ids[i * bs:(i + 1) * bs])
            d = chain_digest(prev, block)
            if not self.tier.contains(namespace, d):
                break
            digests.append(d)
            blocks.append(block)
            prev = d
        if not digests:
            return 0
        newly_referenced = sum(1 for nd in m.path if nd.ref_count == 0)
        if len(digests) > (self._pool.num_free + self._tree.num_unreferenced
                           - newly_referenced):
            return 0  # no room to load into: compute instead
        last = m.path[-1] if m.path else None
        if last is not None:
            self._tree.lock(last)  # the path stays while its continuation loads
        block_ids = self._allocate(len(digests))
        self._requests[request_id + LOAD_SUFFIX] = RequestState(
            request_id + LOAD_SUFFIX, namespace, start * bs,
            [nd.block_id for nd in m.path] + block_ids,  # type: ignore[misc]
            len(m.path), last)
        self._loads[request_id] = self.tier.load(LoadJob(namespace, digests, blocks, block_ids))
        return None

    def finish_done(self) -> int:
        """Put every finished load's blocks into the tree; returns the loads finished."""
        done = [rid for rid, job in self._loads.items() if job.done.is_set()]
        for rid in done:
            self._finish(rid, self._loads.pop(rid))
        return len(done)

    def _finish(self, request_id: str, job: LoadJob) -> None:
        st = self._requests.pop(request_id + LOAD_SUFFIX)
        k = job.num_loaded
        to_free = list(job.block_ids[k:])
        if k:
            tokens = [t for block in job.token_blocks[:k] for t in block]
            res = self._tree.insert(st.namespace, tokens, job.block_ids[:k],
                                    parent=st.last_node)
            to_free += [*res.duplicate_block_ids, *res.pruned_block_ids]
            self.hit_blocks += k
            self.hit_requests += 1
        if st.last_node is not None:
            self._tree.unlock(st.last_node)
        self._pool.free(to_free)
        if request_id in self._abandoned:
            self._abandoned.discard(request_id)
        else:
            self._finished[request_id] = k * self._tree.block_size

    def forget(self, request_id: str) -> None:
        """The request left before admission (abort, failure): its finished-load mark goes; a
        load still running finishes into the tree on its own."""
        self._finished.pop(request_id, None)
        if request_id in self._loads:
            self._abandoned.add(request_id)

    def wait_all(self, timeout_s: float) -> None:
        """Finish every queued load (shutdown), waiting up to ``timeout_s`` for each."""
        for job in list(self._loads.values()):
            job.done.wait(timeout_s)
        self.finish_done()
        self._finished.clear()
        self._abandoned.clear()

    def save_all(self, timeout_s: float) -> int:
        """Spill every cached block not on disk yet (a clean shutdown), within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        nodes = list(self._tree.iter_nodes())
        queued = 0
        step = max(1, self.tier.backlog_limit // self.tier.file_bytes)
        for i in range(0, len(nodes), step):
            if time.monotonic() >= deadline or not self.tier.enabled:
                break
            queued += self.spill(nodes[i:i + step])
            self.tier.flush(max(0.0, deadline - time.monotonic()))
        return queued
