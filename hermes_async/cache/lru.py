"""Evictable leaves of the prefix tree, oldest first, in a ``sortedcontainers.SortedList``.

Entries are ``(last_access_time, node_id, node)``: node ids are unique, so the node itself is
never compared. A node's time must not change while it is in the index: discard, update, add.
"""

from __future__ import annotations

from collections.abc import Iterator

from sortedcontainers import SortedList

from hermes_async.cache.structs import TreeNode


class LruIndex:
    """Ordered set of evictable nodes; add, discard and pop-oldest are O(log n)."""

    __slots__ = ("_entries", "_members")

    def __init__(self) -> None:
        self._entries: SortedList = SortedList()
        self._members: set[int] = set()

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, node: TreeNode) -> bool:
        return node.node_id in self._members

    def add(self, node: TreeNode) -> None:
        if node.node_id not in self._members:
            self._members.add(node.node_id)
            self._entries.add((node.last_access_time, node.node_id, node))

    def discard(self, node: TreeNode) -> None:
        if node.node_id in self._members:
            self._members.remove(node.node_id)
            self._entries.remove((node.last_access_time, node.node_id, node))

    def pop_oldest(self) -> TreeNode:
        """Remove and return the least recently used node (IndexError when empty)."""
        _, node_id, node = self._entries.pop(0)
        self._members.remove(node_id)
        return node

    def __iter__(self) -> Iterator[tuple[float, int, TreeNode]]:
        """Entries oldest first, as stored (for integrity checks and debugging)."""
        return iter(self._entries)
