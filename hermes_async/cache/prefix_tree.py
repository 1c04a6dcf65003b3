"""Block prefix tree: match, insert, reference, evict, prune, reset; one root per namespace.

The tree never touches the block pool: whatever it frees (eviction, pruning, reset) it returns
as block ids, and the caller hands them back to the pool. Times come from ``clock`` (default: a
logical counter, one tick per operation), so LRU order is deterministic and testable.
"""

from __future__ import annotations

from collections.abc import Sequence

from hermes_async.cache.errors import CacheError
from hermes_async.cache.integrity import check_tree
from hermes_async.cache.structs import InsertResult, MatchResult, TreeNode
from hermes_async.cache.tree_store import TreeStore


class PrefixTree(TreeStore):
    """Cached full token blocks per namespace, with reference counts and LRU eviction.

    ``PrefixTree(block_size, fork_limit=None, clock=None)``. Same tokens in two namespaces
    never share a node. A node with ``ref_count`` > 0 is never evicted or pruned.
    """

    def match(self, namespace: str, token_ids: Sequence[int], *, touch: bool = True) -> MatchResult:
        """Longest cached full-block prefix of ``token_ids``, never the whole prompt.

        Walks block by block from the namespace root and stops at the first miss; at most
        ``(len(token_ids) - 1) // block_size`` blocks match, so the last token is always left
        to compute. Cost grows with the matched blocks, not the tree size. ``touch=False`` is a
        pure read: no LRU update, no statistics.
        """
        root = self._roots.get(namespace)
        n, bs = len(token_ids), self.block_size
        path: list[TreeNode] = []
        node = root
        if root is not None and n > bs:
            for start in range(0, (n - 1) // bs * bs, bs):  # copy only the blocks walked
                child = node.children.get(tuple(token_ids[start:start + bs]))
                if child is None:
                    break
                path.append(child)
                node = child
        result = MatchResult(namespace, n, len(path) * bs, tuple(path), node)
        if touch:
            self.touch(result)
        return result

    def touch(self, match: MatchResult) -> None:
        """Mark ``match``'s path as used now (LRU order).

        Hit counts are not kept here: the engine counts each request's first admission once
        (``hermes_async.observe.cache_observer``), for ``/metrics`` and ``/cache/stats`` alike.

        For a ``touch=False`` match that the caller decides to act on; call it before any other
        change to the tree.
        """
        if match.path and not match.path[-1].live:
            raise CacheError("touch() of a stale match: its nodes left the tree")
        now = self._clock()
        for node in match.path:
            self._set_time(node, now)

    def insert(self, namespace: str, token_ids: Sequence[int], block_ids: Sequence[int], *,
               parent: TreeNode | None = None) -> InsertResult:
        """Add computed full blocks below ``parent`` (default: the namespace root).

        ``token_ids`` holds exactly ``len(block_ids)`` full blocks: those that follow
        ``parent``. Ownership contract: new nodes take the caller's block ids. Where a block's
        tokens are already cached (another request inserted them first), the existing node is
        kept; if its block differs from the caller's, the caller's block is listed in
        ``duplicate_block_ids`` and stays the caller's, to free (after switching its block table
        to the node's block) or to keep private. Past the fork limit, least recently used
        unreferenced child subtrees of the branching node are pruned (blocks in
        ``pruned_block_ids``, for the pool); when every child is referenced the insert still
        succeeds and ``fork_limit_all_referenced`` is counted. New nodes are unreferenced leaves:
        reference them with :meth:`lock`. Invalid input raises before anything changes.
        """
        bs, n = self.block_size, len(block_ids)
        if len(token_ids) != n * bs:
            raise ValueError(f"{len(token_ids)} token ids for {n} blocks of {bs}")
        if parent is not None and (not parent.live or parent.namespace != namespace):
            raise CacheError(f"insert below {parent!r}: not a live node of {namespace!r}")
        toks = tuple(token_ids)
        keys = [toks[i * bs:(i + 1) * bs] for i in range(n)]
        base = parent if parent is not None else self._roots.get(namespace)
        node = base
        existing: list[TreeNode] = []
        while node is not None and len(existing) < n:
            child = node.children.get(keys[len(existing)])
            if child is None:
                break
            existing.append(child)
            node = child
        k = len(existing)
        fresh = block_ids[k:]
        for i, b in enumerate(block_ids):
            owner = self._by_block.get(b)
            if owner is not None and (i >= k or owner is not existing[i]):
                raise CacheError(f"block {b} already belongs to {owner!r}")
        if len(set(fresh)) != len(fresh):
            raise CacheError(f"block ids given twice in {list(fresh)}")

        if base is None:
            base = self._root(namespace)
        node = existing[-1] if existing else base
        now = self._clock()
        st = self._stats_for(namespace)
        dups = tuple(b for nd, b in zip(existing, block_ids, strict=False) if nd.block_id != b)
        for nd in existing:
            self._set_time(nd, now)
        pruned: list[int] = []
        if fresh and self.fork_limit is not None:
            pruned, all_referenced = self._prune_children(node, self.fork_limit - 1)
            st.fork_limit_all_referenced += all_referenced
        path = existing
        for key, b in zip(keys[k:], fresh, strict=True):
            node = self._attach(node, key, b, now, st)
            path.append(node)
        st.inserted_blocks += len(fresh)
        st.duplicate_blocks += len(dups)
        return InsertResult(tuple(path), node, len(fresh), dups, tuple(pruned))

    def lock(self, node: TreeNode, stop: TreeNode | None = None) -> None:
        """Pin ``node`` and its ancestors up to, not including, ``stop`` (default: the root).

        A request references its path once; when the path grows from ``old`` to ``new`` it calls
        ``lock(new, stop=old)``, so each node of its path carries exactly one of its references.
        """
        for nd in self._chain(node, stop):
            if nd.ref_count == 0:
                self._lru.discard(nd)
                self._num_referenced += 1
                self._stats[nd.namespace].referenced_blocks += 1
            nd.ref_count += 1

    def unlock(self, node: TreeNode, stop: TreeNode | None = None) -> None:
        """Undo :meth:`lock` of the same chain and mark it used now (LRU counts release time).

        Raises :class:`CacheError`, changing nothing, if a node of the chain is not referenced.
        """
        chain = self._chain(node, stop)
        for nd in chain:
            if nd.ref_count <= 0:
                raise CacheError(f"unlock of unreferenced {nd!r} (released twice?)")
        now = self._clock()
        for nd in chain:  # deepest first: only the deepest can become an evictable leaf
            nd.ref_count -= 1
            nd.last_access_time = now
            if nd.ref_count == 0:
                self._num_referenced -= 1
                self._stats[nd.namespace].referenced_blocks -= 1
                if not nd.children:
                    self._lru.add(nd)

    def evict(self, n_blocks: int, evicted: list[TreeNode] | None = None) -> list[int]:
        """Free up to ``n_blocks`` unreferenced leaves, least recently used first; O(log n) each.

        A parent whose last child goes is evictable at once (and may go in the same call).
        Fewer blocks come back only when nothing unreferenced is left. Returns the freed block ids;
        ``evicted``, when given, receives the nodes (children before their parents).
        """
        freed: list[int] = []
        while len(freed) < n_blocks and self._lru:
            node = self._lru.pop_oldest()
            if evicted is not None:
                evicted.append(node)
            self._stats[node.namespace].evicted_blocks += 1
            freed.append(self._drop_leaf(node))
        return freed

    def prune_forks(self) -> list[int]:
        """Bring nodes left above the fork limit (their children were referenced) back to it.

        For a background task: prunes least recently used unreferenced child subtrees of those
        nodes and returns the freed block ids.
        """
        freed: list[int] = []
        for node in list(self._over_limit.values()):
            if node.live and self.fork_limit is not None:
                freed += self._prune_children(node, self.fork_limit)[0]
        return freed

    def reset(self, namespace: str | None = None) -> list[int]:
        """Drop every node of one namespace (or of all) and return their blocks.

        Refuses with :class:`CacheError`, changing nothing, while any of them is referenced.
        The counters of :meth:`stats` are kept (they feed monotonic metrics).
        """
        names = list(self._roots) if namespace is None else [namespace]
        held = {ns: self._stats[ns].referenced_blocks for ns in names if ns in self._roots}
        if any(held.values()):
            raise CacheError(f"reset refused while blocks are referenced: {held}")
        freed: list[int] = []
        for ns in names:
            root = self._roots.pop(ns, None)
            if root is not None:
                for child in list(root.children.values()):
                    freed += self._drop_subtree(child)
                self._over_limit.pop(root.node_id, None)
                root.live = False
        return freed

    def check_integrity(self) -> None:
        """Raise :class:`IntegrityError` unless every tree invariant holds (full walk)."""
        check_tree(self)

    def _prune_children(self, node: TreeNode, keep: int) -> tuple[list[int], bool]:
        """Prune LRU unreferenced child subtrees until ``node`` has at most ``keep`` children.

        Returns the freed blocks and whether it stopped because every child left is referenced.
        """
        freed: list[int] = []
        st = self._stats[node.namespace]
        while len(node.children) > keep:
            victim = min((c for c in node.children.values() if c.ref_count == 0),
                         key=lambda c: (c.last_access_time, c.node_id), default=None)
            if victim is None:
                return freed, True
            dropped = self._drop_subtree(victim)
            st.pruned_subtrees += 1
            st.pruned_blocks += len(dropped)
            freed += dropped
        return freed, False
