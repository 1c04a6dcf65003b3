"""The prefix cache's disk tier behind the real server (default model, the official ``openai``
client): an evicted prompt comes back from disk with the same greedy answer as a server
without the tier, a restart reports the cached tokens on its first request, another
namespace gets none, damaged files answer like a cold start, a directory that cannot be
written or a full disk only turn the tier off, and nothing is held afterwards."""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
from pathlib import Path
from typing import Any

import openai
import pytest

from hermes_async.config import CacheConfig, EngineConfig
from tests.server.helpers import ServerThread, engine_idle, real_config, request, request_json

MODEL = "SmolLM2-135M-Instruct"
SYSTEM = ("You are the support assistant of a lighthouse museum. Visitors ask about opening "
          "hours (9 to 17, closed on Mondays), tickets (12 euros, children free), the lamp "
          "(a first-order Fresnel lens from 1873), the keeper's house, the 212 steps to the "
          "top, and the gift shop. Answer in one short sentence, politely, and never invent "
          "facts that are not listed here. ") * 3
QUESTION = "How many steps are there to the top?"


def disk_config(model_dir: Path, disk: Path) -> EngineConfig:
    base = real_config(model_dir)
    return dataclasses.replace(base, cache=CacheConfig(kv_cache_bytes=256 << 20,
                                                       disk_dir=str(disk)))


def ask(srv: Any, salt: str | None = None) -> tuple[str, Any]:
    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
    r = client.chat.completions.create(
        model=MODEL, temperature=0.0, max_tokens=24,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        extra_body={"cache_salt": salt} if salt else None)
    return r.choices[0].message.content or "", r.usage


def cached(usage: Any) -> int:
    details = usage.prompt_tokens_details
    return details.cached_tokens if details is not None else 0


def evict_everything(srv: Any) -> None:
    def evict() -> None:
        cache = srv.engine.core.cache
        cache.evict(cache.pool.num_blocks)
        assert cache.disk.tier.flush(30)
    srv.call(evict)


def full_blocks(usage: Any, block_size: int) -> int:
    return (usage.prompt_tokens - 1) // block_size * block_size


def test_an_evicted_prompt_comes_back_from_disk_with_the_same_answer(
        server: Any, default_model_dir: Path, tmp_path: Path) -> None:
    plain, _ = ask(server)
    srv = ServerThread(disk_config(default_model_dir, tmp_path / "kv")).start()
    try:
        cold, u0 = ask(srv)
        assert cold == plain and cached(u0) == 0
        evict_everything(srv)
        stats = request_json(f"{srv.url}/cache/stats")[2]
        bs = stats["block_size"]
        assert stats["blocks"]["cached"] == 0 and stats["disk"]["blocks"] > 0
        again, u1 = ask(srv)
        assert again == plain
        assert cached(u1) == full_blocks(u1, bs)  # every full block, from disk
        stats = request_json(f"{srv.url}/cache/stats")[2]
        assert stats["disk"]["hit_tokens"] == cached(u1)
        assert stats["totals"]["prefix"]["disk_hit_tokens"] == cached(u1)
        assert stats["totals"]["prefix"]["disk_hit_rate"] > 0
        metrics = request(f"{srv.url}/metrics")[2].decode()
        assert "hermes_kv_disk_loaded_blocks_total" in metrics
        assert "hermes_prefix_cache_disk_hits_total" in metrics
        idle = srv.call(lambda: engine_idle(srv.engine))
        assert idle == dict.fromkeys(idle, 0)
        status, _, _ = request_json(f"{srv.url}/cache/reset", {"namespace": "default"})
        assert status == 200
        assert not list((tmp_path / "kv").rglob("*.kv"))  # the tenant's disk blocks went too
    finally:
        srv.stop()


def test_a_restart_is_warm_for_the_same_namespace_only(default_model_dir: Path,
                                                       tmp_path: Path) -> None:
    config = disk_config(default_model_dir, tmp_path / "kv")
    srv = ServerThread(config).start()
    try:
        first, _ = ask(srv)
    finally:
        srv.stop()  # a clean shutdown writes the pool's cached blocks
    srv = ServerThread(config).start()
    try:
        text, usage = ask(srv)
        assert text == first and cached(usage) > 0  # the first request after the restart
        _, other = ask(srv, salt="another-tenant")
        assert cached(other) == 0
    finally:
        srv.stop()


def test_damaged_files_answer_like_a_cold_start(default_model_dir: Path,
                                                tmp_path: Path) -> None:
    config = disk_config(default_model_dir, tmp_path / "kv")
    srv = ServerThread(config).start()
    try:
        cold, _ = ask(srv)
    finally:
        srv.stop()
    files = sorted((tmp_path / "kv").rglob("*.kv"))
    assert files
    for i, f in enumerate(files):
        data = f.read_bytes()
        f.write_bytes(data[:len(data) // 3] if i % 2 else data[:-7] + b"garbage")
    srv = ServerThread(config).start()
    try:
        text, usage = ask(srv)
        assert text == cold
        stats = request_json(f"{srv.url}/cache/stats")[2]["disk"]
        assert stats["corrupt_files"] >= 1 and stats["enabled"]
        idle = srv.call(lambda: engine_idle(srv.engine))
        assert idle == dict.fromkeys(idle, 0)
    finally:
        srv.stop()


def test_an_unwritable_directory_serves_without_the_tier(
        default_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING):
        srv = ServerThread(disk_config(default_model_dir, blocker / "kv")).start()
    try:
        assert "KV disk tier off" in caplog.text
        text, _ = ask(srv)
        assert text
        assert "disk" not in request_json(f"{srv.url}/cache/stats")[2]
    finally:
        srv.stop()


def test_a_full_disk_turns_the_tier_off_and_requests_go_on(
        default_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    srv = ServerThread(disk_config(default_model_dir, tmp_path / "kv")).start()
    try:
        cold, _ = ask(srv)

        def full(fd: int, parts: object) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "writev", full)
        with caplog.at_level(logging.WARNING):
            def evict() -> None:
                cache = srv.engine.core.cache
                cache.evict(cache.pool.num_blocks)
                cache.disk.tier.flush(30)
            srv.call(evict)
        assert "KV disk tier off" in caplog.text
        stats = request_json(f"{srv.url}/cache/stats")[2]["disk"]
        assert not stats["enabled"] and "No space left" in stats["reason"]
        text, usage = ask(srv)
        assert text == cold and cached(usage) == 0  # computed again, no error
        assert request(f"{srv.url}/health")[0] == 200
    finally:
        monkeypatch.undo()
        srv.stop()
