"""The prefix cache's second tier: KV blocks on disk, one self-checking file per block.

Layout: ``disk_dir / <fingerprint> / <namespace seed> / <chained digest>.kv`` (directories
0700, files 0600). The fingerprint directory keeps blocks of another model, dtype,
quantization, block size or KV layout apart (they are never read). A block's name is its
chained digest (:mod:`hermes_async.cache.digest`), seeded with its namespace: a request of one
namespace can only ever name that namespace's files, and a load checks the stored token ids
against the request's own.

Threads, no asyncio: a writer thread writes spilled blocks (temp file + rename; the byte bound
enforced after each write by removing the least recently used files) and a loader thread reads
and checks blocks back into pool blocks (:class:`LoadJob`), then calls ``notify``. The index
(namespace, digest) -> file size, in LRU order, is rebuilt from the directory at open (no file
is read until a match needs it); a miss in it checks the file system once, so replicas sharing
the directory see each other's blocks. Any write error (full disk, read-only directory) turns
the tier off with one warning: the server goes on without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hermes_async.cache.digest import namespace_seed
from hermes_async.cache.disk_files import (
    SUFFIX,
    BlockFileError,
    decode_block,
    encode_block,
    file_size,
)
from hermes_async.step import KVBlockIO

log = logging.getLogger("hermes_async.cache.disk")

Key = tuple[str, bytes]  # (namespace directory name, block digest)


@dataclass
class DiskTierStats:
    """Figures of the tier (counters only grow; ``blocks``/``bytes``/``backlog_*`` are gauges)."""

    enabled: bool = True
    reason: str = ""
    blocks: int = 0
    bytes: int = 0
    max_bytes: int = 0
    written_blocks: int = 0
    written_bytes: int = 0
    removed_blocks: int = 0  # by the byte bound
    dropped_blocks: int = 0  # spills refused: the write backlog was full
    backlog_blocks: int = 0
    backlog_bytes: int = 0
    loads: int = 0
    loaded_blocks: int = 0
    loaded_bytes: int = 0
    load_seconds: float = 0.0
    missing_files: int = 0
    corrupt_files: int = 0
    write_errors: int = 0

    def as_dict(self) -> dict[str, float | int | bool | str]:
        return dict(self.__dict__)


@dataclass
class LoadJob:
    """Blocks to read back: ``digests[i]`` (tokens ``token_blocks[i]``) into ``block_ids[i]``.

    ``num_loaded`` (set when ``done``): how many of them, from the first, are now in their
    pool blocks; the rest (a missing, corrupt or truncated file ends the run) are misses.
    """

    namespace: str
    digests: list[bytes]
    token_blocks: list[tuple[int, ...]]
    block_ids: list[int]
    num_loaded: int = 0
    seconds: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Write:
    key: Key
    generation: int
    token_ids: tuple[int, ...]
    payload: bytes


class DiskTier:
    """See the module docstring. Build with :meth:`open` (None when the directory is unusable).
    """

    def __init__(self, root: Path, max_bytes: int, io: KVBlockIO, *,
                 backlog_bytes: int = 256 << 20, block_size: int,
                 notify: Callable[[], None] | None = None) -> None:
        self.root = root
        self.io = io
        self.block_size = block_size
        self.file_bytes = file_size(block_size, io.block_bytes)
        self.backlog_limit = backlog_bytes
        self.notify = notify or (lambda: None)
        self._lock = threading.Lock()
        self._index: OrderedDict[Key, int] = OrderedDict()
        self._queued: set[Key] = set()
        self._generation: dict[str, int] = {}
        self._stats = DiskTierStats(max_bytes=max_bytes)
        self._writes: queue.Queue[_Write | None] = queue.Queue()
        self._loads: queue.Queue[LoadJob | None] = queue.Queue()
        self._closed = False
        self._rebuild_index()
        self._threads = [threading.Thread(target=self._write_loop, name="hermes-kv-disk-write",
                                          daemon=True),
                         threading.Thread(target=self._load_loop, name="hermes-kv-disk-load",
                                          daemon=True)]
        for t in self._threads:
            t.start()

    @classmethod
    def open(cls, directory: str | Path, max_bytes: int, io: KVBlockIO, *, block_size: int,
             backlog_bytes: int = 256 << 20,
             notify: Callable[[], None] | None = None) -> DiskTier | None:
        """The tier over ``directory`` for ``io.fingerprint``; None (with a warning) when the
        directory cannot be made or written."""
        base = Path(directory).expanduser()
        root = base / io.fingerprint
        try:
            if not base.exists():
                base.mkdir(mode=0o700, parents=True)
            _make_private_dir(root)
            probe = root / f".probe-{os.getpid()}"
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.close(fd)
            probe.unlink()
        except OSError as e:
            log.warning("KV disk tier off: %s is not a writable directory (%s)", root, e)
            return None
        return cls(root, max_bytes, io, backlog_bytes=backlog_bytes, block_size=block_size,
                   notify=notify)

    # ----- lookups (the loop) ------------------------------------------------------------------
    @staticmethod
    def namespace_dir(namespace: str) -> str:
        return namespace_seed(namespace).hex()

    def _path(self, key: Key) -> Path:
        return self.root / key[0] / f"{key[1].hex()}{SUFFIX}"

    def contains(self, namespace: str, digest: bytes) -> bool:
        """Whether the block is on disk (index, else one ``stat``: another replica's file)."""
        if not self._stats.enabled:
            return False
        key = (self.namespace_dir(namespace), digest)
        with self._lock:
            if key in self._index:
                return True
        try:
            size = self._path(key).stat().st_size
        except OSError:
            return False
        if size != self.file_bytes:
            return False
        with self._lock:
            if key not in self._index:
                self._index[key] = size
                self._stats.blocks += 1
                self._stats.bytes += size
        return True

    @property
    def enabled(self) -> bool:
        return self._stats.enabled

    def backlog_room(self) -> int:
        """Blocks the write backlog can take now (at least one block always fits an empty
        backlog)."""
        with self._lock:
            return max(0, max(1, self.backlog_limit // self.file_bytes) - len(self._queued))

    def stats(self) -> DiskTierStats:
        with self._lock:
            st = DiskTierStats(**self._stats.__dict__)
            st.backlog_blocks = len(self._queued)
            st.backlog_bytes = len(self._queued) * self.file_bytes
        return st

    # ----- spills (the loop: a copy out of the pool; the file write in the writer thread) ---
    def spill(self, namespace: str, items: Sequence[tuple[bytes, tuple[int, ...], int]]) -> int:
        """Queue blocks leaving the pool, ``(digest, token ids, block id)`` each, for writing.

        Copies their KV now (the caller frees the blocks next). Blocks already on disk or
        queued are skipped; past the write backlog the rest are dropped (counted). Returns
        the blocks queued.
        """
        if self._closed or not self._stats.enabled or not items:
            return 0
        ns = self.namespace_dir(namespace)
        with self._lock:
            gen = self._generation.get(ns, 0)
            room = max(1, self.backlog_limit // self.file_bytes) - len(self._queued)
            todo = []
            for digest, tokens, block in items:
                key = (ns, digest)
                if key in self._index:
                    self._index.move_to_end(key)
                elif key not in self._queued:
                    if len(todo) >= room:
                        self._stats.dropped_blocks += 1
                        continue
                    todo.append((key, tokens, block))
                    self._queued.add(key)
        if not todo:
            return 0
        try:
            payloads = self.io.read_blocks([b for _, _, b in todo])
        except Exception as e:  # noqa: BLE001 - a failed copy only costs the spill
            log.warning("KV disk tier: copying %d blocks out of the pool failed: %s", len(todo), e)
            with self._lock:
                self._queued.difference_update(k for k, _, _ in todo)
            return 0
        for (key, tokens, _), payload in zip(todo, payloads, strict=True):
            self._writes.put(_Write(key, gen, tokens, payload))
        return len(todo)

    def _write_loop(self) -> None:
        while True:
            item = self._writes.get()
            if item is None:
                return
            try:
                self._write(item)
            finally:
                with self._lock:
                    self._queued.discard(item.key)

    def _write(self, item: _Write) -> None:
        if not self._stats.enabled:
            return
        path = self._path(item.key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            _make_private_dir(path.parent)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                parts = encode_block(item.key[1], item.token_ids, item.payload)
                total = sum(len(p) for p in parts)
                if os.writev(fd, parts) != total:
                    raise OSError("short write")
            finally:
                os.close(fd)
            with self._lock:
                if self._generation.get(item.key[0], 0) != item.generation:
                    stale = True  # the namespace was reset while this block waited
                else:
                    stale = False
                    os.replace(tmp, path)
                    if item.key not in self._index:
                        self._stats.blocks += 1
                        self._stats.bytes += total
                    self._index[item.key] = total
                    self._stats.written_blocks += 1
                    self._stats.written_bytes += total
                    victims = self._over_bound()
            if stale:
                tmp.unlink(missing_ok=True)
                return
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            self._disable(f"writing {path.name} failed: {e}")
            return
        for victim in victims:
            with contextlib.suppress(OSError):
                self._path(victim).unlink()

    def _over_bound(self) -> list[Key]:
        """Under the lock: drop LRU entries until the bytes fit; return their keys."""
        victims = []
        while self._stats.bytes > self._stats.max_bytes and self._index:
            key, size = self._index.popitem(last=False)
            self._stats.bytes -= size
            self._stats.blocks -= 1
            self._stats.removed_blocks += 1
            victims.append(key)
        return victims

    def _disable(self, reason: str) -> None:
        with self._lock:
            if not self._stats.enabled:
                return
            self._stats.enabled = False
            self._stats.reason = reason
            self._stats.write_errors += 1
        log.warning("KV disk tier off (the server goes on without it): %s", reason)

    # ----- loads (the loader thread) -----------------------------------------------------------
    def load(self, job: LoadJob) -> LoadJob:
        """Queue ``job``; the loader thread sets ``job.done`` and calls ``notify``."""
        if self._closed:
            job.done.set()
        else:
            self._loads.put(job)
        return job

    def _load_loop(self) -> None:
        while True:
            job = self._loads.get()
            if job is None:
                return
            t0 = time.perf_counter()
            try:
                self._load(job)
            except Exception:  # noqa: BLE001 - a failed load is a miss
                log.exception("KV disk tier: load failed")
                job.num_loaded = 0
            job.seconds = time.perf_counter() - t0
            with self._lock:
                self._stats.loads += 1
                self._stats.loaded_blocks += job.num_loaded
                self._stats.loaded_bytes += job.num_loaded * self.file_bytes
                self._stats.load_seconds += job.seconds
            job.done.set()
            self.notify()

    def _load(self, job: LoadJob) -> None:
        ns = self.namespace_dir(job.namespace)
        payloads = []
        for digest, tokens in zip(job.digests, job.token_blocks, strict=True):
            key = (ns, digest)
            path = self._path(key)
            try:
                data = path.read_bytes()
                payloads.append(decode_block(data, digest, tokens, self.io.block_bytes))
            except FileNotFoundError:
                self._forget(key, corrupt=False)
                break
            except (OSError, BlockFileError) as e:
                log.warning("KV disk tier: dropping %s (%s)", path.name, e)
                self._forget(key, corrupt=True)
                with contextlib.suppress(OSError):
                    path.unlink()
                break
            with self._lock:
                if key in self._index:
                    self._index.move_to_end(key)
            with contextlib.suppress(OSError):
                os.utime(path)  # LRU order survives a restart
        if payloads:
            self.io.write_blocks(job.block_ids[:len(payloads)], payloads)
        job.num_loaded = len(payloads)

    def _forget(self, key: Key, *, corrupt: bool) -> None:
        with self._lock:
            size = self._index.pop(key, None)
            if size is not None:
                self._stats.blocks -= 1
                self._stats.bytes -= size
            if corrupt:
                self._stats.corrupt_files += 1
            else:
                self._stats.missing_files += 1

    # ----- maintenance -------------------------------------------------------------------------
    def remove(self, namespace: str | None = None) -> int:
        """Delete the blocks of one namespace (or all) from disk; returns how many."""
        names = None if namespace is None else {self.namespace_dir(namespace)}
        with self._lock:
            keys = [k for k in self._index if names is None or k[0] in names]
            for k in keys:
                self._stats.bytes -= self._index.pop(k)
                self._stats.blocks -= 1
            dirs = names if names is not None else {k[0] for k in keys} | {
                p.name for p in self.root.iterdir() if p.is_dir()}
            for ns in dirs:
                self._generation[ns] = self._generation.get(ns, 0) + 1
        for ns in dirs:
            d = self.root / ns
            for p in list(d.glob(f"*{SUFFIX}")) if d.is_dir() else []:
                with contextlib.suppress(OSError):
                    p.unlink()
        return len(keys)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued write is on disk (or ``timeout_s`` passes); True if drained."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._queued:
                    return True
            time.sleep(0.005)
        return False

    def close(self, timeout_s: float) -> bool:
        """Finish the queued writes for up to ``timeout_s``, then stop the threads; True if
        every write got done."""
        drained = self.flush(timeout_s)
        self._closed = True
        if not drained:
            with contextlib.suppress(queue.Empty):
                while True:
                    self._writes.get_nowait()
        self._writes.put(None)
        self._loads.put(None)
        for t in self._threads:
            t.join(timeout=max(1.0, timeout_s))
        return drained

    def _rebuild_index(self) -> None:
        """The index from the files (names and sizes only), oldest modification first."""
        found = []
        for d in self.root.iterdir():
            if not d.is_dir():
                continue
            for entry in os.scandir(d):
                if entry.name.endswith(".tmp"):  # a write cut short by a crash
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                    continue
                if not entry.name.endswith(SUFFIX):
                    continue
                try:
                    digest = bytes.fromhex(entry.name[:-len(SUFFIX)])
                    st = entry.stat()
                except (ValueError, OSError):
                    continue
                found.append((st.st_mtime, (d.name, digest), st.st_size))
        found.sort(key=lambda f: f[0])
        for _, key, size in found:
            self._index[key] = size
            self._stats.blocks += 1
            self._stats.bytes += size
        victims = self._over_bound()
        for victim in victims:
            with contextlib.suppress(OSError):
                self._path(victim).unlink()
        if found:
            log.info("KV disk tier: %d blocks (%.1f MiB) found in %s", self._stats.blocks,
                     self._stats.bytes / 2**20, self.root)


def _make_private_dir(path: Path) -> None:
    """``path`` (below a directory that exists), 0700 (an existing one is tightened to it)."""
    path.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
