"""The serving benchmark's command-line flags and the :class:`BenchConfig` they make."""

from __future__ import annotations

import argparse
import json
from typing import Any

from serving_config import BenchConfig


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """Every flag of ``bench_serving.py``."""
    ap = argparse.ArgumentParser(description=description)
    a = ap.add_argument
    a("--base-url", default=BenchConfig.base_url, help="OpenAI base URL (…/v1)")
    a("--model", default=None, help="default: the first of GET /v1/models")
    a("--api-key", default=None)
    a("--workload", default="shared_system", help="a name in workloads.WORKLOADS")
    a("--system-tokens", type=int, default=None)
    a("--prompt-tokens", type=int, default=None, help="prefix_share: prompt length")
    a("--share", type=_floats, default=None, help="prefix_share: e.g. 0,0.25,0.5,0.75,0.9")
    a("--users", type=int, default=None, help="multi_turn: conversations")
    a("--turns", type=int, default=None, help="multi_turn: turns per conversation")
    a("--tenants", type=int, default=None)
    a("--param", action="append", default=[], metavar="K=V",
      help="another workload parameter (V as JSON, else a string)")
    a("--tokenizer", default=None, help="local model dir: size prompts in exact tokens")
    a("--concurrency", type=_ints, default=None, help="e.g. 1,8,32")
    a("--request-rate", type=_floats, default=None, help="req/s (Poisson), e.g. 1,2,inf")
    a("--num-requests", type=int, default=None, help="per point (default 32)")
    a("--duration", type=float, default=None, help="seconds per point")
    a("--max-tokens", type=int, default=64)
    a("--warmup", type=int, default=2)
    a("--seed", type=int, default=0)
    a("--temperature", type=float, default=0.0)
    a("--ignore-eos", action="store_true", help="vLLM's extra: always max_tokens tokens")
    a("--timeout", type=float, default=600.0, help="seconds per request")
    a("--label", default="server", help="the server's name in tables and plots")
    a("--out", default=None, help="JSON results")
    a("--plot-dir", default=None)
    a("--keep-text", action="store_true", help="answers in the JSON")
    a("--compare", nargs="+", default=None, metavar="JSON",
      help="only tabulate and plot earlier results together")
    return ap


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    params: dict[str, Any] = {k: getattr(args, k) for k in
                              ("system_tokens", "prompt_tokens", "users", "turns", "tenants")
                              if getattr(args, k) is not None}
    for kv in args.param:
        k, _, v = kv.partition("=")
        try:
            params[k] = json.loads(v)
        except ValueError:
            params[k] = v
    num = args.num_requests
    if num is None and args.duration is None:
        num = 32
    return BenchConfig(
        base_url=args.base_url, model=args.model, api_key=args.api_key,
        workload=args.workload, workload_params=params, shares=args.share,
        concurrency=args.concurrency, request_rate=args.request_rate, num_requests=num,
        duration_s=args.duration, max_tokens=args.max_tokens, warmup=args.warmup,
        seed=args.seed, temperature=args.temperature, ignore_eos=args.ignore_eos,
        tokenizer=args.tokenizer, timeout_s=args.timeout, label=args.label, out=args.out,
        plot_dir=args.plot_dir, keep_text=args.keep_text)
