"""Operator pins: cached prefixes held in the tree for a time to live, refreshed on each hit.

A pin holds one reference (``PrefixTree.lock``) on the path from a namespace's root to its
deepest node, exactly like a running request, so eviction and pruning never take those blocks.
``PinTable`` keeps the pins and their deadlines; :class:`~hermes_async.cache.manager.
KVCacheManager` calls it (it owns no tree or pool itself). Times are seconds of the caller's
clock (``time.monotonic`` in the engine), passed in explicitly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hermes_async.cache.structs import TreeNode


@dataclass(slots=True)
class Pin:
    """One pinned prefix: its deepest node, depth in blocks, deadline and hit count."""

    namespace: str
    node: TreeNode
    num_blocks: int
    ttl_s: float
    expires_at: float
    hits: int = 0

    def path(self) -> Iterator[TreeNode]:
        """The pinned nodes, deepest first."""
        nd: TreeNode | None = self.node
        while nd is not None and not nd.is_root:
            yield nd
            nd = nd.parent

    def to_dict(self, now: float, block_size: int) -> dict[str, float | int | str]:
        return {"namespace": self.namespace, "tokens": self.num_blocks * block_size,
                "blocks": self.num_blocks, "ttl_s": self.ttl_s,
                "expires_in_s": round(max(0.0, self.expires_at - now), 3), "hits": self.hits}


class PinLimitError(RuntimeError):
    """Pinning this prefix would take the pinned blocks past ``cache.max_pinned_blocks``."""


class PinTable:
    """Pins by deepest node id; ``covered_blocks()`` counts distinct pinned nodes."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self._pins: dict[int, Pin] = {}

    def __len__(self) -> int:
        return len(self._pins)

    def __iter__(self) -> Iterator[Pin]:
        return iter(list(self._pins.values()))

    def get(self, node: TreeNode) -> Pin | None:
        return self._pins.get(node.node_id)

    def covered_blocks(self, extra: Pin | None = None) -> int:
        """Distinct tree nodes held by pins (shared prefixes count once), plus ``extra``'s."""
        seen: set[int] = set()
        pins = [*self._pins.values(), *([extra] if extra is not None else [])]
        for pin in pins:
            for nd in pin.path():
                if nd.node_id in seen:
                    break  # the rest of this path is an ancestor chain already counted
                seen.add(nd.node_id)
        return len(seen)

    def add(self, pin: Pin) -> None:
        """Register a new pin (its node locked by the caller); raises :class:`PinLimitError`
        without registering it when the cap would be passed."""
        covered = self.covered_blocks(pin)
        if covered > self.max_blocks:
            raise PinLimitError(f"pinning {pin.num_blocks} blocks would hold {covered} pinned "
                                f"blocks, over cache.max_pinned_blocks={self.max_blocks}")
        self._pins[pin.node.node_id] = pin

    def remove(self, pin: Pin) -> None:
        del self._pins[pin.node.node_id]

    def refresh_on_hit(self, path: tuple[TreeNode, ...], now: float) -> None:
        """A request matched ``path``: every pin whose whole prefix it covers is hit."""
        if not self._pins:
            return
        for nd in path:
            pin = self._pins.get(nd.node_id)
            if pin is not None:
                pin.hits += 1
                pin.expires_at = now + pin.ttl_s

    def expired(self, now: float) -> list[Pin]:
        return [p for p in self._pins.values() if p.expires_at <= now]

    def in_namespace(self, namespace: str | None) -> list[Pin]:
        return [p for p in self._pins.values() if namespace is None or p.namespace == namespace]
