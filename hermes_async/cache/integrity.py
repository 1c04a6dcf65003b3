"""Full-walk checks of the cache invariants; each failure raises :class:`IntegrityError`.

Written as plain ``if ...: raise`` so they survive ``python -O``. They cost a walk of the whole
tree and pool: for tests, debugging and an optional periodic audit, not for every step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from hermes_async.cache.errors import IntegrityError
from hermes_async.cache.structs import RequestState, TreeNode

if TYPE_CHECKING:
    from hermes_async.cache.block_pool import BlockPool
    from hermes_async.cache.tree_store import TreeStore


def _fail(message: str) -> None:
    raise IntegrityError(message)


def check_tree(tree: TreeStore) -> None:
    """Structure, block index, reference counts, LRU index, fork-limit index and namespace
    gauges."""
    bs, limit = tree.block_size, tree.fork_limit
    by_block: dict[int, TreeNode] = {}
    seen: set[int] = set()
    evictable: set[int] = set()
    over: set[int] = set()
    stats, roots = tree.stats(), tree.roots()
    referenced_total = 0
    for ns, root in roots.items():
        if not (root.is_root and root.live and root.parent is None and root.namespace == ns):
            _fail(f"bad root for namespace {ns!r}: {root!r}")
        if root.ref_count != 0:
            _fail(f"root of {ns!r} is referenced: {root!r}")
        count = referenced = 0
        stack = [root]
        while stack:
            node = stack.pop()
            if node.node_id in seen:
                _fail(f"node id {node.node_id} reached twice (shared or cyclic): {node!r}")
            seen.add(node.node_id)
            child_refs = 0
            for key, child in node.children.items():
                if key != child.token_ids:
                    _fail(f"child key {key} != its token_ids {child.token_ids}: {child!r}")
                if child.parent is not node or child.namespace != ns or not child.live:
                    _fail(f"child {child!r} does not belong below {node!r} in {ns!r}")
                child_refs += child.ref_count
                stack.append(child)
            if limit is not None and len(node.children) > limit:
                over.add(node.node_id)
            if node is root:
                continue
            if len(node.token_ids) != bs:
                _fail(f"{node!r} holds {len(node.token_ids)} tokens, not one block of {bs}")
            if node.block_id is None or node.block_id in by_block:
                _fail(f"block {node.block_id} of {node!r} is missing or in two nodes")
            by_block[node.block_id] = node
            if node.ref_count < child_refs:
                _fail(f"{node!r} has fewer references than its children ({child_refs}): "
                      "references must run along paths from the root")
            count += 1
            referenced += node.ref_count > 0
            if node.ref_count == 0 and not node.children:
                evictable.add(node.node_id)
        st = stats.get(ns)
        if st is None or st.blocks != count or st.referenced_blocks != referenced:
            _fail(f"namespace {ns!r}: counted {count} blocks, {referenced} referenced; "
                  f"stats say {st}")
        referenced_total += referenced
    for ns, st in stats.items():
        if ns not in roots and (st.blocks or st.referenced_blocks):
            _fail(f"namespace {ns!r} has no tree but its gauges say {st}")
    if tree.block_ids() != set(by_block) or any(
            tree.node_for_block(b) is not nd for b, nd in by_block.items()):
        _fail(f"block index != tree blocks; differ on {sorted(tree.block_ids() ^ set(by_block))}")
    if tree.num_nodes != sum(st.blocks for st in stats.values()):
        _fail(f"namespace block counts do not add up to {tree.num_nodes}")
    if tree.num_referenced != referenced_total:
        _fail(f"referenced counter {tree.num_referenced} != referenced nodes "
              f"{referenced_total}")
    entries = tree.evictable_entries()
    listed = {node_id for _, node_id, _ in entries}
    if len(listed) != len(entries) or listed != evictable or tree.num_evictable != len(entries):
        _fail("evictable index != unreferenced leaves; differ on node ids "
              f"{sorted(listed ^ evictable)}")
    for t, node_id, node in entries:
        if t != node.last_access_time or node_id != node.node_id:
            _fail(f"stale LRU key ({t}, {node_id}) for {node!r}")
    if {nd.node_id for nd in tree.over_limit_nodes()} != over:
        _fail("fork-limit index != nodes with more children than the fork limit")


def check_manager(pool: BlockPool, tree: TreeStore, requests: Mapping[str, RequestState],
                  pinned_nodes: Iterable[TreeNode] = ()) -> None:
    """Every block is in exactly one of free list / tree / one request; each node's ref count
    equals the requests plus operator pins (``pinned_nodes``: their deepest nodes) holding it."""
    pool.check_integrity()
    check_tree(tree)
    total = pool.num_blocks
    free = set(pool.free_block_ids())
    in_tree = tree.block_ids()
    if free & in_tree:
        _fail(f"blocks both free and in the tree: {sorted(free & in_tree)[:10]}")
    owner: dict[int, str] = {}
    refs: Counter[int] = Counter()
    for rid, st in requests.items():
        n = st.num_cached_blocks
        if st.request_id != rid or not 0 <= n <= len(st.block_table):
            _fail(f"request {rid!r}: bad state {st}")
        path: list[TreeNode] = []
        node = st.last_node
        if node is not None and (not node.live or node.namespace != st.namespace):
            _fail(f"request {rid!r} references {node!r}, not a live node of {st.namespace!r}")
        while node is not None and not node.is_root:
            path.append(node)
            node = node.parent
        path.reverse()
        if [nd.block_id for nd in path] != st.block_table[:n]:
            _fail(f"request {rid!r}: cached part of its block table {st.block_table[:n]} "
                  f"!= its referenced path {[nd.block_id for nd in path]}")
        refs.update(nd.node_id for nd in path)
        for b in st.block_table[n:]:
            where = ("free" if b in free else "in the tree" if b in in_tree
                     else f"private to {owner[b]!r}" if b in owner
                     else "outside the pool" if not 0 <= b < total else None)
            if where is not None:
                _fail(f"block {b}, private to request {rid!r}, is also {where}")
            owner[b] = rid
    for last in pinned_nodes:
        if not last.live:
            _fail(f"operator pin on {last!r}, which left the tree")
        node = last
        while node is not None and not node.is_root:
            refs[node.node_id] += 1
            node = node.parent
    if len(free) + len(in_tree) + len(owner) != total:
        lost = sorted(set(range(total)) - free - in_tree - set(owner))
        _fail(f"free {len(free)} + tree {len(in_tree)} + private {len(owner)} != pool {total}; "
              f"unaccounted blocks {lost[:10]}")
    for node in tree.iter_nodes():
        if node.ref_count != refs[node.node_id]:
            _fail(f"{node!r}: ref_count {node.ref_count} but {refs[node.node_id]} holders "
                  "reference it (requests plus operator pins)")
