"""``hermes-async generate``: one chat turn through the engine, streamed to stdout."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from hermes_async import config as config_mod


async def _generate(args: argparse.Namespace) -> int:
    from hermes_async.engine.async_engine import AsyncEngine
    from hermes_async.types import SamplingParams

    cfg = config_mod.load(args.config) if args.config else config_mod.EngineConfig()
    overrides = {"dtype": args.dtype} if args.dtype else {}
    if args.model:
        overrides["path"] = args.model
    cfg = cfg.replace(model=overrides) if overrides else cfg
    if cfg.cache.kv_cache_bytes is None:  # one request: a small pool starts faster
        cfg = cfg.replace(cache={"kv_cache_bytes": 64 << 20})
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            seed=args.seed)
    messages = [{"role": "user", "content": args.prompt}]
    async with AsyncEngine(cfg) as engine:
        t0 = time.perf_counter()
        usage = None
        async for out in engine.generate(messages=messages, params=params):
            sys.stdout.write(out.text)
            sys.stdout.flush()
            usage = out.usage or usage
        elapsed = time.perf_counter() - t0
        sys.stdout.write("\n")
        if usage is not None:
            print(f"[{usage.prompt_tokens} prompt tokens, {usage.completion_tokens} new tokens "
                  f"in {elapsed:.2f} s, {usage.completion_tokens / max(elapsed, 1e-9):.1f} "
                  f"tok/s; model {engine.model_dir}]", file=sys.stderr)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    return asyncio.run(_generate(args))
