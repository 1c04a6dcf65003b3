"""KV prefix cache: block pool, block prefix tree, and the per-request manager (no torch, no
asyncio). See ``manager.py`` for the engine-facing contract."""

from hermes_async.cache.block_pool import BlockPool
from hermes_async.cache.errors import CacheError, IntegrityError
from hermes_async.cache.manager import KVCacheManager
from hermes_async.cache.prefix_tree import PrefixTree
from hermes_async.cache.structs import (
    Admission,
    CacheStats,
    CacheUsage,
    InsertResult,
    MatchResult,
    NamespaceStats,
    RequestState,
    TreeNode,
)

__all__ = [
    "Admission", "BlockPool", "CacheError", "CacheStats", "CacheUsage", "InsertResult",
    "IntegrityError", "KVCacheManager", "MatchResult", "NamespaceStats", "PrefixTree",
    "RequestState", "TreeNode",
]
