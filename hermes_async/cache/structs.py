"""Plain data of the prefix cache: tree nodes, results, per-namespace figures, request state.

Nothing here mutates anything else; :mod:`prefix_tree` and :mod:`manager` own all changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class TreeNode:
    """One full block of token ids and the physical block that holds its KV.

    ``children`` maps the next block's token ids to the child node. A namespace's root has empty
    ``token_ids`` and ``block_id`` None; roots are never referenced, evicted or pruned.
    ``ref_count`` is the number of holders (running requests and operator pins) whose
    referenced path contains this node.
    ``live`` turns False when the node leaves the tree (eviction, pruning, reset); a dead node
    must not be passed back to the tree. ``digest`` caches the chained block digest
    (:mod:`hermes_async.cache.digest`) once the disk tier asked for it.
    """

    __slots__ = (
        "node_id", "namespace", "token_ids", "block_id", "parent", "children",
        "ref_count", "last_access_time", "live", "digest",
    )

    def __init__(
        self,
        node_id: int,
        namespace: str,
        token_ids: tuple[int, ...],
        block_id: int | None,
        parent: TreeNode | None,
        now: float,
    ) -> None:
        self.node_id = node_id
        self.namespace = namespace
        self.token_ids = token_ids
        self.block_id = block_id
        self.parent = parent
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.ref_count = 0
        self.last_access_time = now
        self.live = True
        self.digest: bytes | None = None  # chained block digest, computed when first needed

    @property
    def is_root(self) -> bool:
        return self.block_id is None

    def __repr__(self) -> str:
        return (f"TreeNode(id={self.node_id}, ns={self.namespace!r}, block={self.block_id}, "
                f"ref={self.ref_count}, t={self.last_access_time}, "
                f"children={len(self.children)}, live={self.live})")


class MatchResult(NamedTuple):
    """Outcome of :meth:`PrefixTree.match`.

    ``matched_len`` is in tokens (a multiple of the block size, at most ``query_len - 1``);
    ``path`` holds the matched nodes from the root down; ``last_node`` is where the walk stopped:
    the deepest matched node, the namespace root when nothing matched, or None when the namespace
    has no tree yet.
    """

    namespace: str
    query_len: int
    matched_len: int
    path: tuple[TreeNode, ...]
    last_node: TreeNode | None


class InsertResult(NamedTuple):
    """Outcome of :meth:`PrefixTree.insert`.

    ``path``: one node per inserted block, in order (existing or new); ``last_node``: the deepest
    of them (the insertion parent when no block was given). ``num_new``: nodes created; they
    now own the caller's block ids. ``duplicate_block_ids``: caller blocks whose tokens were
    already cached under another block: they stay the caller's (free them, or keep them private).
    ``pruned_block_ids``: blocks freed by fork-limit pruning; the caller returns them to the pool.
    """

    path: tuple[TreeNode, ...]
    last_node: TreeNode
    num_new: int
    duplicate_block_ids: tuple[int, ...]
    pruned_block_ids: tuple[int, ...]


@dataclass(slots=True)
class NamespaceStats:
    """Figures of one namespace. Counters only grow (``reset`` keeps them); ``blocks`` and
    ``referenced_blocks`` are gauges of the nodes in the tree now and of those referenced (by
    running requests or operator pins)."""

    inserted_blocks: int = 0
    duplicate_blocks: int = 0
    evicted_blocks: int = 0
    pruned_subtrees: int = 0
    pruned_blocks: int = 0
    fork_limit_all_referenced: int = 0
    blocks: int = 0
    referenced_blocks: int = 0


@dataclass(slots=True)
class RequestState:
    """The blocks one running request holds (owned by :class:`KVCacheManager`).

    ``block_table[:num_cached_blocks]`` are the blocks of the tree nodes on the request's referenced
    path (root to ``last_node``); ``block_table[num_cached_blocks:]`` are private to the request.
    """

    request_id: str
    namespace: str
    matched_len: int
    block_table: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0
    last_node: TreeNode | None = None


class Admission(NamedTuple):
    """A request admitted: compute from ``matched_len``; ``block_table`` is a copy."""

    matched_len: int
    block_table: list[int]


class CacheUsage(NamedTuple):
    """Blocks by state: ``free + cached + referenced + private == total``.

    ``cached``: in the tree and unreferenced (evictable); ``referenced``: in the tree and held
    by a running request or an operator pin; ``private``: owned by one running request, not
    (yet) in the tree. ``operator_pinned`` (part of ``referenced``): distinct blocks held by
    operator pins (``/cache/warm`` with ``pin_ttl_s``).
    """

    total: int
    free: int
    cached: int
    referenced: int
    private: int
    operator_pinned: int = 0

    @property
    def used_fraction(self) -> float:
        return (self.total - self.free) / self.total


@dataclass(frozen=True)
class CacheStats:
    """Snapshot for metrics: usage, per-namespace figures, allocations refused."""

    usage: CacheUsage
    namespaces: dict[str, NamespaceStats]
    allocation_failures: int
