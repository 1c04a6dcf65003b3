"""``hermes-async generate``: one chat turn through the engine, streamed to stdout."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from hermes_async.config import DTYPE_CHOICES as DTYPES


def register(subparsers: Any) -> None:
    """Add ``generate`` to the top-level subparsers; it sets ``func=run``."""
    gen = subparsers.add_parser("generate", help="one-shot chat completion, streamed to stdout")
    gen.add_argument("prompt", nargs="?", default="What is the capital of France?")
    gen.add_argument("--model", default=None, help="HF directory (default: embedded model)")
    gen.add_argument("--config", default=None, help="TOML config file")
    gen.add_argument("--dtype", default=None, choices=DTYPES)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``hermes-async generate``."""
    return asyncio.run(_generate(args))


async def _generate(args: argparse.Namespace) -> int:
    from hermes_async import AsyncEngine, EngineConfig, SamplingParams
    from hermes_async.config import load

    cfg = load(args.config) if args.config else EngineConfig()
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
