"""Structure and indices of the prefix tree: nodes, roots, block index, LRU index, counters.

:class:`TreeStore` keeps every index consistent under the three structural changes (attach a
leaf, drop a leaf, retime a node); :class:`hermes_async.cache.prefix_tree.PrefixTree` builds the
cache operations on top. Read-only views here serve integrity checks, metrics and debugging.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator

from hermes_async.cache.errors import CacheError
from hermes_async.cache.lru import LruIndex
from hermes_async.cache.structs import NamespaceStats, TreeNode


class TreeStore:
    """Nodes of all namespaces and the indices over them.

    Invariants (see :func:`hermes_async.cache.integrity.check_tree`): references run along paths
    from the root, so a referenced node's ancestors are referenced; the LRU index holds exactly
    the non-root leaves with ``ref_count`` 0; ``_by_block`` maps every tree block to its node.
    """

    def __init__(self, block_size: int, *, fork_limit: int | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, not {block_size}")
        if fork_limit is not None and fork_limit < 1:
            raise ValueError(f"fork_limit must be at least 1 or None, not {fork_limit}")
        self.block_size = block_size
        self.fork_limit = fork_limit
        self._ticks = itertools.count(1)
        self._clock: Callable[[], float] = clock or self._ticks.__next__
        self._ids = itertools.count()
        self._roots: dict[str, TreeNode] = {}
        self._stats: dict[str, NamespaceStats] = {}
        self._by_block: dict[int, TreeNode] = {}
        self._lru = LruIndex()
        self._over_limit: dict[int, TreeNode] = {}  # nodes with more children than fork_limit
        self._num_referenced = 0

    # ----- figures and read-only views ----------------------------------------------------
    @property
    def num_nodes(self) -> int:
        """Blocks held by the tree (roots hold none)."""
        return len(self._by_block)

    @property
    def num_referenced(self) -> int:
        return self._num_referenced

    @property
    def num_unreferenced(self) -> int:
        """Blocks eviction can free, now or once their (unreferenced) descendants are gone."""
        return len(self._by_block) - self._num_referenced

    @property
    def num_evictable(self) -> int:
        """Evictable leaves right now."""
        return len(self._lru)

    def stats(self) -> dict[str, NamespaceStats]:
        """A snapshot (copies) of every namespace's figures."""
        return {ns: dataclasses.replace(st) for ns, st in self._stats.items()}

    def node_for_block(self, block_id: int) -> TreeNode | None:
        return self._by_block.get(block_id)

    def block_ids(self) -> set[int]:
        return set(self._by_block)

    def roots(self) -> dict[str, TreeNode]:
        return dict(self._roots)

    def evictable_entries(self) -> list[tuple[float, int, TreeNode]]:
        """The LRU index as stored: ``(last_access_time, node_id, node)``, oldest first."""
        return list(self._lru)

    def over_limit_nodes(self) -> list[TreeNode]:
        return list(self._over_limit.values())

    def iter_nodes(self, namespace: str | None = None) -> Iterator[TreeNode]:
        """Every non-root node of one namespace (or of all), each before its descendants."""
        if namespace is None:
            roots = list(self._roots.values())
        else:
            roots = [self._roots[namespace]] if namespace in self._roots else []
        for root in roots:
            yield from iter_subtree(root)

    # ----- structural changes -------------------------------------------------------------
    def _stats_for(self, namespace: str) -> NamespaceStats:
        st = self._stats.get(namespace)
        if st is None:
            st = self._stats[namespace] = NamespaceStats()
        return st

    def _root(self, namespace: str) -> TreeNode:
        root = self._roots.get(namespace)
        if root is None:
            root = TreeNode(next(self._ids), namespace, (), None, None, 0)
            self._roots[namespace] = root
            self._stats_for(namespace)
        return root

    def _set_time(self, node: TreeNode, now: float) -> None:
        if node in self._lru:
            self._lru.discard(node)
            node.last_access_time = now
            self._lru.add(node)
        else:
            node.last_access_time = now

    def _chain(self, node: TreeNode, stop: TreeNode | None) -> list[TreeNode]:
        """``node`` and its ancestors up to, not including, ``stop`` (default: the root)."""
        if not node.live:
            raise CacheError(f"{node!r} is not in the tree")
        chain: list[TreeNode] = []
        nd: TreeNode | None = node
        while nd is not None and nd is not stop and not nd.is_root:
            chain.append(nd)
            nd = nd.parent
        if stop is not None and nd is not stop:
            raise CacheError(f"{stop!r} is not an ancestor of {node!r}")
        return chain

    def _attach(self, parent: TreeNode, key: tuple[int, ...], block_id: int, now: float,
                st: NamespaceStats) -> TreeNode:
        """Add an unreferenced leaf below ``parent`` (which stops being an evictable leaf)."""
        self._lru.discard(parent)
        node = TreeNode(next(self._ids), parent.namespace, key, block_id, parent, now)
        parent.children[key] = node
        self._by_block[block_id] = node
        st.blocks += 1
        if self.fork_limit is not None and len(parent.children) > self.fork_limit:
            self._over_limit[parent.node_id] = parent
        self._lru.add(node)
        return node

    def _drop_leaf(self, node: TreeNode) -> int:
        """Detach a leaf and return its block; the parent becomes evictable if it can be."""
        parent = node.parent
        if parent is None or node.children:
            raise CacheError(f"_drop_leaf of {node!r}: not a leaf below a parent")
        self._lru.discard(node)
        self._over_limit.pop(node.node_id, None)
        del parent.children[node.token_ids]
        del self._by_block[node.block_id]  # type: ignore[arg-type]
        self._stats[node.namespace].blocks -= 1
        node.live = False
        if self.fork_limit is None or len(parent.children) <= self.fork_limit:
            self._over_limit.pop(parent.node_id, None)
        if not parent.children and parent.ref_count == 0 and not parent.is_root:
            self._lru.add(parent)
        return node.block_id  # type: ignore[return-value]

    def _drop_subtree(self, top: TreeNode) -> list[int]:
        """Detach ``top`` and all its descendants (all unreferenced); return their blocks."""
        subtree = [top, *iter_subtree(top)]
        return [self._drop_leaf(nd) for nd in reversed(subtree)]  # children before parents


def iter_subtree(top: TreeNode) -> Iterator[TreeNode]:
    """Descendants of ``top`` (not ``top`` itself), each before its own descendants."""
    stack = list(top.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())
