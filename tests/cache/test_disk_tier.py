"""The prefix cache's disk tier over a fake pool: spill on eviction, load back before admission,
restart, tenants, fingerprints, corrupt files, the byte bound, a failing disk."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from hermes_async.cache import KVCacheManager
from hermes_async.cache.digest import block_hashes
from hermes_async.cache.disk_files import file_size
from hermes_async.cache.disk_tier import DiskTier
from tests.cache.helpers import BS, toks

BLOCK_BYTES = 96


class FakePool:
    """A KV pool of byte strings: block id -> its bytes (the KVBlockIO of the tests)."""

    def __init__(self, fingerprint: str = "model-a") -> None:
        self.fingerprint = fingerprint
        self.block_bytes = BLOCK_BYTES
        self.data: dict[int, bytes] = {}

    def read_blocks(self, block_ids: Sequence[int]) -> list[bytes]:
        return [self.data[b] for b in block_ids]

    def write_blocks(self, block_ids: Sequence[int], payloads: Sequence[bytes | memoryview]
                     ) -> None:
        for b, p in zip(block_ids, payloads, strict=True):
            self.data[b] = bytes(p)


def kv_of(namespace: str, prefix: Sequence[int]) -> bytes:
    """The (fake) KV of a prefix's last block: depends on everything before it."""
    return hashlib.shake_256(repr((namespace, list(prefix))).encode()).digest(BLOCK_BYTES)


def make(tmp: Path, num_blocks: int = 16, io: FakePool | None = None,
         max_bytes: int = 1 << 30) -> tuple[KVCacheManager, FakePool, DiskTier]:
    io = io or FakePool()
    m = KVCacheManager(num_blocks, BS)
    tier = DiskTier.open(tmp, max_bytes, io, block_size=BS)
    assert tier is not None
    m.attach_disk(tier)
    return m, io, tier


def run(m: KVCacheManager, io: FakePool, rid: str, ns: str, prompt: list[int]) -> int:
    """Admit (loading from disk first), 'compute' the rest, commit, release; the matched
    length at admission."""
    while (loaded := m.prepare(rid, ns, prompt)) is None:
        assert m.disk is not None
        for job in list(m.disk._loads.values()):
            assert job.done.wait(5)
    assert loaded is not None
    adm = m.admit(rid, ns, prompt)
    assert adm is not None
    for i in range(adm.matched_len // BS, len(prompt) // BS):
        io.data[adm.block_table[i]] = kv_of(ns, prompt[:(i + 1) * BS])
    m.commit(rid, prompt)
    m.release(rid)
    return adm.matched_len


def assert_blocks_hold(m: KVCacheManager, io: FakePool, rid: str, ns: str,
                       prompt: list[int]) -> int:
    """Admit ``prompt`` and check every matched block's bytes against its prefix's KV."""
    while m.prepare(rid, ns, prompt) is None:
        assert m.disk is not None
        for job in list(m.disk._loads.values()):
            assert job.done.wait(5)
    adm = m.admit(rid, ns, prompt)
    assert adm is not None
    for i in range(adm.matched_len // BS):
        assert io.data[adm.block_table[i]] == kv_of(ns, prompt[:(i + 1) * BS]), i
    m.release(rid)
    m.check_integrity()
    return adm.matched_len


def evict_all(m: KVCacheManager, tier: DiskTier) -> None:
    m.evict(m.pool.num_blocks)
    assert tier.flush(5)


def test_evicted_blocks_come_back_bit_identical(tmp_path: Path) -> None:
    m, io, tier = make(tmp_path)
    prompt = toks(1, 2, 3, 4, tail=1)
    assert run(m, io, "r1", "ns", prompt) == 0
    evict_all(m, tier)
    assert m.tree.num_nodes == 0 and tier.stats().blocks == 4
    for b in list(io.data):
        io.data[b] = b"\0" * BLOCK_BYTES  # the pool's blocks get reused for other things
    assert assert_blocks_hold(m, io, "r2", "ns", prompt) == 4 * BS
    stats = m.disk_stats()
    assert stats is not None and stats["hit_tokens"] == 4 * BS and stats["loaded_blocks"] == 4
    assert m.usage().private == 0 and m.num_loading == 0


def test_a_partial_disk_run_loads_what_is_there_and_the_pool_part_stays(tmp_path: Path) -> None:
    m, io, tier = make(tmp_path)
    run(m, io, "a", "ns", toks(1, 2, tail=1))
    evict_all(m, tier)
    run(m, io, "b", "ns", toks(1, tail=1))  # block 1 back in the pool, block 2 on disk only
    assert m.tree.num_nodes == 1
    assert assert_blocks_hold(m, io, "c", "ns", toks(1, 2, 3, tail=1)) == 2 * BS


def test_namespaces_never_load_each_other(tmp_path: Path) -> None:
    m, io, tier = make(tmp_path)
    run(m, io, "a", "tenant-a", toks(5, 6, tail=1))
    evict_all(m, tier)
    assert m.prepare("b", "tenant-b", toks(5, 6, tail=1)) == 0
    assert run(m, io, "b", "tenant-b", toks(5, 6, tail=1)) == 0
    assert assert_blocks_hold(m, io, "c", "tenant-a", toks(5, 6, tail=1)) == 2 * BS


def test_restart_finds_the_blocks_and_another_fingerprint_ignores_them(tmp_path: Path) -> None:
    m, io, tier = make(tmp_path)
    prompt = toks(7, 8, 9, tail=2)
    run(m, io, "r", "ns", prompt)
    m.close_disk(5)  # a clean shutdown writes the pool's cached blocks
    assert tier.stats().blocks == 3
    m2, io2, tier2 = make(tmp_path)
    assert tier2.stats().blocks == 3
    assert assert_blocks_hold(m2, io2, "r", "ns", prompt) == 3 * BS
    m3, _, tier3 = make(tmp_path, io=FakePool("model-b"))
    assert tier3.stats().blocks == 0 and m3.prepare("r", "ns", prompt) == 0
    for t in (tier2, tier3):
        t.close(1)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "swap"])
def test_damaged_files_are_misses_and_get_removed(tmp_path: Path, damage: str) -> None:
    m, io, tier = make(tmp_path)
    prompt = toks(1, 2, 3, tail=1)
    run(m, io, "r", "ns", prompt)
    evict_all(m, tier)
    digests = block_hashes("ns", prompt, BS)
    path = tier.root / tier.namespace_dir("ns") / f"{digests[1].hex()}.kv"
    data = path.read_bytes()
    if damage == "flip":
        path.write_bytes(data[:-5] + bytes([data[-5] ^ 1]) + data[-4:])
    elif damage == "truncate":
        path.write_bytes(data[:len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # another block's file under this name
        other = tier.root / tier.namespace_dir("ns") / f"{digests[2].hex()}.kv"
        path.write_bytes(other.read_bytes())
    matched = assert_blocks_hold(m, io, "r2", "ns", prompt)
    assert matched == BS  # block 0 loaded; the damaged block 1 ends the run
    assert not path.exists()
    st = tier.stats()
    assert st.corrupt_files + st.missing_files >= 1
    if damage != "truncate" and damage != "empty":
        assert st.corrupt_files == 1


def test_the_byte_bound_holds_under_a_soak(tmp_path: Path) -> None:
    one = file_size(BS, BLOCK_BYTES)
    m, io, tier = make(tmp_path, num_blocks=12, max_bytes=10 * one)
    for i in range(60):
        run(m, io, f"r{i}", f"ns{i % 3}", toks(i, i + 1, i + 2, tail=1))
        m.evict(m.pool.num_blocks // 2)
        assert tier.stats().bytes <= 10 * one
    assert tier.flush(5)
    files = list(tier.root.rglob("*.kv"))
    st = tier.stats()
    assert st.bytes <= 10 * one and len(files) == st.blocks and st.removed_blocks > 0
    assert sum(f.stat().st_size for f in files) == st.bytes
    m.check_integrity()


def test_reset_of_a_namespace_removes_its_files_only(tmp_path: Path) -> None:
    m, io, tier = make(tmp_path)
    run(m, io, "a", "a", toks(1, 2, tail=1))
    run(m, io, "b", "b", toks(1, 2, tail=1))
    evict_all(m, tier)
    m.reset("a")
    assert m.prepare("a2", "a", toks(1, 2, tail=1)) == 0
    assert assert_blocks_hold(m, io, "b2", "b", toks(1, 2, tail=1)) == 2 * BS
    assert not list((tier.root / tier.namespace_dir("a")).glob("*.kv"))


def test_files_are_private(tmp_path: Path) -> None:
    m, io, tier = make(tmp_path / "kv")
    run(m, io, "a", "ns", toks(1, 2, tail=1))
    evict_all(m, tier)
    for d in [tier.root, *[p for p in tier.root.rglob("*") if p.is_dir()]]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    files = list(tier.root.rglob("*.kv"))
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert stat.S_IMODE((tmp_path / "kv").stat().st_mode) == 0o700


def test_an_abort_during_a_load_leaks_nothing(tmp_path: Path) -> None:
    m, io, tier = make(tmp_path)
    prompt = toks(1, 2, 3, tail=1)
    run(m, io, "r", "ns", prompt)
    evict_all(m, tier)
    assert m.prepare("r2", "ns", prompt) is None  # loading
    m.forget("r2")  # the client went away
    m.check_integrity()
    assert m.disk is not None
    m.disk.wait_all(5)
    assert m.usage().private == 0 and m.num_loading == 0
    assert m.prepare("r2", "ns", prompt) == 0  # its blocks are in the pool now: no load
    m.check_integrity()


def test_replicas_sharing_a_directory_see_each_other(tmp_path: Path) -> None:
    m1, io1, tier1 = make(tmp_path)
    m2, io2, tier2 = make(tmp_path)  # opened before m1 wrote anything
    prompt = toks(4, 5, tail=1)
    run(m1, io1, "r", "ns", prompt)
    evict_all(m1, tier1)
    assert assert_blocks_hold(m2, io2, "r", "ns", prompt) == 2 * BS
    tier2.close(1)


def test_write_through_shares_a_prefix_before_any_eviction(tmp_path: Path) -> None:
    m1, io1, tier1 = make(tmp_path)
    m1.disk.write_through = True  # type: ignore[union-attr]
    m2, io2, tier2 = make(tmp_path)
    prompt = toks(4, 5, 6, tail=1)
    run(m1, io1, "r", "ns", prompt)
    assert m1.tree.num_nodes == 3 and tier1.flush(5)
    assert assert_blocks_hold(m2, io2, "r", "ns", prompt) == 3 * BS
    evict_all(m1, tier1)  # already on disk: nothing written twice
    assert tier1.stats().written_blocks == 3
    tier2.close(1)


def test_an_unusable_directory_means_no_tier(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING):
        assert DiskTier.open(blocker / "kv", 1 << 20, FakePool(), block_size=BS) is None
    assert "KV disk tier off" in caplog.text


def test_a_failing_disk_turns_the_tier_off_and_requests_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    m, io, tier = make(tmp_path)

    def full(fd: int, parts: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "writev", full)
    run(m, io, "a", "ns", toks(1, 2, tail=1))
    with caplog.at_level(logging.WARNING):
        evict_all(m, tier)
    assert "KV disk tier off" in caplog.text
    st = tier.stats()
    assert not st.enabled and st.write_errors == 1 and st.blocks == 0
    assert not list(tier.root.rglob("*.tmp"))
    assert run(m, io, "b", "ns", toks(1, 2, tail=1)) == 0  # computed again, no error
    m.evict(16)
    m.check_integrity()


def test_the_config_keys_are_checked() -> None:
    from hermes_async.config import CacheConfig, ConfigError, from_dict

    cfg = from_dict({"cache": {"disk_dir": "/var/kv", "disk_bytes": 1 << 30,
                               "disk_write_through": True}}).cache
    assert cfg.disk_dir == "/var/kv" and cfg.disk_bytes == 1 << 30 and cfg.disk_write_through
    for bad in ({"disk_bytes": 0}, {"disk_backlog_bytes": -1}, {"disk_shutdown_s": -1.0},
                {"disk_dir": "  "}):
        with pytest.raises(ConfigError):
            CacheConfig(**bad)  # type: ignore[arg-type]
