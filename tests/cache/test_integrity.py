"""check_integrity() must catch real corruption, also under ``python -O``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from hermes_async.cache import IntegrityError, KVCacheManager
from tests.cache.helpers import BS, toks


def busy_manager() -> KVCacheManager:
    """Two requests sharing a cached prefix, one cached-only branch, private blocks."""
    m = KVCacheManager(16, BS, fork_limit=4)
    m.admit("old", "ns", toks(1, 3, tail=1))
    m.commit("old", toks(1, 3, tail=1))
    m.release("old")
    for rid in ("r1", "r2"):
        m.admit(rid, "ns", toks(1, 2, tail=1))
        m.commit(rid, toks(1, 2, tail=1))
    m.check_integrity()
    return m


def node(m: KVCacheManager, *firsts: int):
    return m.tree.match("ns", toks(*firsts, tail=1), touch=False).path[-1]


CORRUPTIONS: dict[str, tuple[Callable[[KVCacheManager], object], str]] = {
    "tree block also freed": (lambda m: m.pool.free([node(m, 1).block_id]), "both free and"),
    "leaked block": (lambda m: m.pool.allocate(1), "unaccounted"),
    "private block shared": (
        lambda m: m._requests["r2"].block_table.append(m._requests["r1"].block_table[-1]),
        "private to"),
    "private block freed": (lambda m: m.pool.free([m.block_table("r1")[-1]]), "also free"),
    "ref count off": (lambda m: setattr(node(m, 1, 2), "ref_count", 1),
                      "fewer references|holders reference"),
    "extra pin on a path": (lambda m: [setattr(n, "ref_count", n.ref_count + 1)
                                       for n in (node(m, 1), node(m, 1, 2))], "holders reference"),
    "evictable leaf missing": (lambda m: m.tree._lru.discard(node(m, 1, 3)), "evictable"),
    "pinned leaf evictable": (lambda m: m.tree._lru.add(node(m, 1, 2)), "evictable"),
    "child key wrong": (lambda m: setattr(node(m, 1, 3), "token_ids", (9,) * BS), "child key"),
    "namespace gauge": (lambda m: setattr(m.tree._stats["ns"], "blocks", 7), "namespace"),
    "stale lru time": (lambda m: setattr(node(m, 1, 3), "last_access_time", -5), "stale"),
    "table not the path": (lambda m: m._requests["r1"].block_table.reverse(), "referenced path"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_check_integrity_catches(name: str) -> None:
    corrupt, message = CORRUPTIONS[name]
    m = busy_manager()
    corrupt(m)
    with pytest.raises(IntegrityError, match=message):
        m.check_integrity()


def test_checks_survive_python_optimize_flag() -> None:
    code = ("from tests.cache.test_integrity import busy_manager, node\n"
            "from hermes_async.cache import IntegrityError\n"
            "m = busy_manager(); m.pool.free([node(m, 1).block_id])\n"
            "try:\n    m.check_integrity()\nexcept IntegrityError:\n    raise SystemExit(0)\n"
            "raise SystemExit(1)\n")
    assert subprocess.run([sys.executable, "-O", "-c", code], check=False).returncode == 0
