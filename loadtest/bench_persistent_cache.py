"""The prefix cache's disk tier: time to first token of a long system prompt (a) cold, (b) as a
pool hit, (c) after its blocks were evicted to disk (a tier-2 hit) and (d) after a restart with
the same ``cache.disk_dir``; and the throughput cost of the tier's writes.

    .venv/bin/python loadtest/bench_persistent_cache.py --out-dir /tmp/persist \\
        --update-benchmarks BENCHMARKS.md

In-process engines (``AsyncEngine``; the HTTP layer adds the same milliseconds to every case),
one token out (TTFT is the whole request), greedy. A case's prompt is the system prompt
(``--prompt-tokens``: seeded random token ids) plus a short question that differs per request,
so each case matches at most the system prompt. (c): every cached block is evicted
(``KVCacheManager.evict``), the writes drained, the pool overwritten with zeros (nothing of the
old KV is left in memory), then the request. (d): the engine stops (a clean shutdown writes
what the pool caches), a new engine over the same directory serves the first request. The
files are in the OS page cache by then, as after a process restart; a reboot would read them
from the disk itself.

Models: the embedded default model, and ``--large`` (default ``qwen3-1.7b``: random weights in
Qwen3-1.7B's shape, loadtest/shaped_models.py, where prefill dominates). Targets: (c) and (d)
<= 0.2x of (a) at 4k tokens on the larger model.

Throughput (``--throughput``, the default model): the ``tenants`` workload (each tenant's long
system prompt, requests in random order, 8 at a time) on a KV pool holding about a third of
the tenants' prompts, without and with the tier; and a variant where every request is a new
tenant, so the tier only writes (nothing it holds is ever asked for again): its ratio is the
cost of the writes alone. Target: the writes cost <= 3% of output throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_models import cpu_line, update_benchmarks

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hermes_async.config import (  # noqa: E402
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
)
from hermes_async.engine.async_engine import AsyncEngine  # noqa: E402
from hermes_async.types import SamplingParams  # noqa: E402

MARK_START, MARK_END = "<!-- persistent:start -->", "<!-- persistent:end -->"
ONE = SamplingParams(max_tokens=1, temperature=0.0)


def kv_bytes_per_token(model_dir: Path, dtype: str) -> int:
    """K and V of every layer for one token, from the model's config.json."""
    from compare_peers import resolve_cpu_dtype

    cfg = json.loads((model_dir / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    elem = 4 if resolve_cpu_dtype(dtype) == "float32" else 2
    return 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * elem


def model_engine(model_dir: Path, disk: Path | None, kv_bytes: int, dtype: str,
                 max_model_len: int) -> AsyncEngine:
    """An engine over ``model_dir``; the output text is not built (TTFT only)."""
    from hermes_async.model.default_model import fetch_default_model
    from hermes_async.model.executor import StepExecutor
    from hermes_async.model.runner import ModelRunner
    from hermes_async.model.tokenizer import load_tokenizer

    cfg = EngineConfig(
        model=ModelConfig(path=str(model_dir), dtype=dtype, device="cpu",
                          max_model_len=max_model_len),
        cache=CacheConfig(kv_cache_bytes=kv_bytes, disk_dir=None if disk is None else str(disk)),
        scheduler=SchedulerConfig(max_num_batched_tokens=2048))
    runner = StepExecutor(ModelRunner(model_dir, cfg.model, cfg.cache))
    tokenizer = load_tokenizer(fetch_default_model(progress=False))
    return AsyncEngine(cfg, runner=runner, tokenizer=tokenizer, eos_token_ids=[],
                       output_text=lambda prompt, stops: _NoText())


class _NoText:
    """Output text that is never built (these runs time the first token only)."""

    class _Delta:
        text, stopped = "", False

    def append(self, token: int) -> Any:
        return self._Delta()

    def finish(self) -> Any:
        return self._Delta()


async def first_token(engine: AsyncEngine, ids: list[int]) -> tuple[float, int]:
    """Seconds to the first token of ``ids`` and the cached tokens reported."""
    t0 = time.perf_counter()
    ttft, cached = None, -1
    async for out in engine.generate(token_ids=ids, params=ONE):
        if ttft is None:
            ttft = time.perf_counter() - t0
        if out.usage is not None:
            cached = out.usage.cached_tokens
    assert ttft is not None
    return ttft, cached


def prompt(system: list[int], i: int, vocab: int) -> list[int]:
    rng = random.Random(f"question-{i}")
    return system + [rng.randrange(100, vocab) for _ in range(12)]


async def ttft_cases(model_dir: Path, tokens: int, work: Path, dtype: str,
                     vocab: int) -> dict[str, Any]:
    """TTFT of (a) cold, (b) pool hit, (c) tier-2 hit, (d) after a restart."""
    rng = random.Random(f"system-{tokens}")
    system = [rng.randrange(100, vocab) for _ in range(tokens)]
    disk = work / f"kv-{tokens}"
    shutil.rmtree(disk, ignore_errors=True)
    kv_bytes = kv_bytes_per_token(model_dir, dtype) * (2 * tokens + 512)
    max_len = tokens + 64
    out: dict[str, Any] = {"tokens": tokens}
    async with model_engine(model_dir, disk, kv_bytes, dtype, max_len) as engine:
        await first_token(engine, [5, 6, 7, 8])  # warm-up (kernels, allocator)
        out["cold"] = await first_token(engine, prompt(system, 0, vocab))
        out["pool_hit"] = await first_token(engine, prompt(system, 1, vocab))
        core = engine.core
        assert core is not None and core.cache.disk is not None
        tier = core.cache.disk.tier
        t0 = time.perf_counter()
        while core.cache.tree.num_nodes:  # paced by the write backlog, as the background is
            core.cache.evict(max(1, tier.backlog_room()))
            assert tier.flush(600)
        out["write_s"] = time.perf_counter() - t0
        core.runner.model_runner.pool.tensor.zero_()  # type: ignore[attr-defined]
        out["tier2_hit"] = await first_token(engine, prompt(system, 2, vocab))
        out["disk"] = engine.cache_stats()["disk"]
    del engine, core, tier
    gc.collect()  # one model in memory at a time: the restarted engine loads its own
    t0 = time.perf_counter()
    async with model_engine(model_dir, disk, kv_bytes, dtype, max_len) as engine:
        out["restart_start_s"] = time.perf_counter() - t0
        out["restart"] = await first_token(engine, prompt(system, 3, vocab))
    shutil.rmtree(disk, ignore_errors=True)
    return out


async def throughput(model_dir: Path, work: Path, dtype: str, *, tier: bool, unique: bool,
                     tenants: int, requests: int, system_tokens: int) -> dict[str, Any]:
    """Output tok/s of the tenants workload (8 at a time), with or without the tier."""
    from hermes_async.builder import AsyncEngine as BuiltEngine

    disk = work / "kv-throughput"
    shutil.rmtree(disk, ignore_errors=True)
    per_prompt = kv_bytes_per_token(model_dir, dtype) * (system_tokens + 64)
    kv_bytes = per_prompt * max(3, tenants // 3)  # about a third of the tenants' prompts
    cfg = EngineConfig(
        model=ModelConfig(path=str(model_dir), dtype=dtype, device="cpu"),
        cache=CacheConfig(kv_cache_bytes=kv_bytes, disk_dir=str(disk) if tier else None))
    rng = random.Random(0)
    systems: dict[int, list[int]] = {}

    def request(i: int) -> list[int]:
        t = i if unique else rng.randrange(tenants)
        if t not in systems:
            r = random.Random(f"tenant-{t}")
            systems[t] = [r.randrange(100, 40000) for _ in range(system_tokens)]
        return prompt(systems[t], i, 40000)

    ids = [request(i) for i in range(requests)]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    async with BuiltEngine(cfg) as engine:
        async def one(p: list[int]) -> int:
            n = 0
            async for out in engine.generate(token_ids=p, params=params):
                n += len(out.token_ids)
            return n

        await one([5, 6, 7])
        sem = asyncio.Semaphore(8)

        async def bounded(p: list[int]) -> int:
            async with sem:
                return await one(p)

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(bounded(p) for p in ids))
        wall = time.perf_counter() - t0
        stats = engine.cache_stats()
    shutil.rmtree(disk, ignore_errors=True)
    return {"tok_s": sum(counts) / wall, "wall_s": wall,
            "hit_rate": stats["totals"]["prefix"]["hit_rate"],
            "disk_hit_rate": stats["totals"]["prefix"].get("disk_hit_rate"),
            "disk": stats.get("disk")}


def ttft_table(label: str, rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{label}:", "",
             "| system prompt | (a) cold | (b) pool hit | (c) tier-2 hit | (d) restart | "
             "(c)/(a) | (d)/(a) | cached (b) / (c) / (d) | blocks written, in s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["cold"][0]
        lines.append(
            f"| {r['tokens']} tok | {a:.3f} s | {r['pool_hit'][0]:.3f} s | "
            f"{r['tier2_hit'][0]:.3f} s | {r['restart'][0]:.3f} s | "
            f"{r['tier2_hit'][0] / a:.3f}x | {r['restart'][0] / a:.3f}x | "
            f"{r['pool_hit'][1]} / {r['tier2_hit'][1]} / {r['restart'][1]} | "
            f"{r['disk']['written_blocks']} ({r['disk']['written_bytes'] / 2**20:.0f} MiB), "
            f"{r['write_s']:.2f} s |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-tokens", nargs="+", type=int, default=[1000, 4000])
    ap.add_argument("--large", default="qwen3-1.7b", help="shaped model (none: skip)")
    ap.add_argument("--large-layers", type=int, default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--tenants", type=int, default=12)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2, help="throughput rounds per arm (best)")
    ap.add_argument("--work-dir", type=Path, default=None)
    ap.add_argument("--out-dir", type=Path, default=Path("loadtest/results/persistent"))
    ap.add_argument("--update-benchmarks", type=Path, default=None)
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="hermes-persist-"))
    from hermes_async.model.default_model import fetch_default_model

    default_dir = fetch_default_model(progress=False)
    results: dict[str, Any] = {"cpu": cpu_line()}
    lines = [f"CPU: {cpu_line()}; dtype {args.dtype}; in-process engines, one token out, "
             "greedy; TTFT in seconds", ""]
    models = [("default model (SmolLM2-135M)", default_dir, 49152)]
    if args.large != "none":
        from shaped_models import SHAPES, make

        slug = args.large + (f"-l{args.large_layers}" if args.large_layers else "")
        large_dir = work / slug
        if not (large_dir / "config.json").is_file():
            print(f"[prepare] {slug}: random weights -> {large_dir}", flush=True)
            make(args.large, large_dir, args.large_layers)
        models.append((f"{slug} (random weights)", large_dir,
                       SHAPES[args.large][1]["vocab_size"]))
    for label, model_dir, vocab in models:
        rows = []
        for tokens in args.prompt_tokens:
            print(f"[ttft] {label}, {tokens} tokens", flush=True)
            row = asyncio.run(ttft_cases(model_dir, tokens, work, args.dtype, min(vocab, 49152)))
            print(json.dumps({k: v for k, v in row.items() if k != "disk"}), flush=True)
            rows.append(row)
        results[label] = rows
        lines += ttft_table(label, rows) + [""]
    if not args.no_throughput:
        arms: dict[str, dict[str, Any]] = {}
        for name, tier, unique in (("off", False, False), ("tier", True, False),
                                   ("off-unique", False, True), ("tier-unique", True, True)):
            best = None
            for _ in range(args.rounds):
                r = asyncio.run(throughput(default_dir, work, args.dtype, tier=tier,
                                           unique=unique, tenants=args.tenants,
                                           requests=args.requests,
                                           system_tokens=args.system_tokens))
                print(f"[throughput] {name}: {r['tok_s']:.1f} tok/s", flush=True)
                if best is None or r["tok_s"] > best["tok_s"]:
                    best = r
            assert best is not None
            arms[name] = best
        results["throughput"] = arms
        lines += [f"Throughput, default model: {args.requests} requests, 8 at a time, "
                  f"{args.system_tokens}-token system prompts, 32 tokens out; best of "
                  f"{args.rounds}:", "",
                  "| workload | tier | output tok/s | vs off | prefix hit rate | disk hit rate "
                  "| blocks written |", "|---|---|---|---|---|---|---|"]
        for name, r in arms.items():
            base = arms["off-unique" if "unique" in name else "off"]["tok_s"]
            workload = ("every request a new tenant" if "unique" in name
                        else f"{args.tenants} tenants, random order")
            disk = r["disk"] or {}
            lines.append(f"| {workload} | {'on' if 'tier' in name else 'off'} | "
                         f"{r['tok_s']:.1f} | {r['tok_s'] / base:.3f}x | "
                         f"{r['hit_rate'] or 0:.3f} | {r['disk_hit_rate'] or 0:.3f} | "
                         f"{disk.get('written_blocks', 0)} |")
    text = "\n".join(lines)
    (args.out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (args.out_dir / "report.md").write_text(text + "\n")
    print(text)
    if args.update_benchmarks:
        update_benchmarks(args.update_benchmarks, "bench_persistent_cache.py", text,
                          MARK_START, MARK_END)
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
