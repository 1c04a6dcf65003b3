"""Chained block digests: block ``i``'s digest covers the namespace and blocks ``0..i``.

One rule for everything that names a cached block outside the tree: the Ray router's shadow
index (``scale/prefix_index.py``) and the disk tier's file names (``cache/disk_tier.py``).
Tenants never share a digest (the namespace seeds the chain).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

DIGEST_SIZE = 12


def namespace_seed(namespace: str) -> bytes:
    """The chain's start for ``namespace`` (the digest of the empty prefix)."""
    return hashlib.blake2b(namespace.encode(), digest_size=DIGEST_SIZE).digest()


def chain_digest(prev: bytes, block: Sequence[int]) -> bytes:
    """The digest of a block that follows the prefix whose digest is ``prev``."""
    h = hashlib.blake2b(prev, digest_size=DIGEST_SIZE)
    h.update(b"".join(int(t).to_bytes(4, "little", signed=True) for t in block))
    return h.digest()


def block_hashes(namespace: str, token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Chained digests of the full blocks of ``token_ids``."""
    out: list[bytes] = []
    prev = namespace_seed(namespace)
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prev = chain_digest(prev, token_ids[start:start + block_size])
        out.append(prev)
    return out
