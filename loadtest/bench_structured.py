"""Structured outputs: what a grammar costs, measured in one run on the default model.

1. Engine output tok/s with a JSON schema vs unconstrained, at concurrency 1 and 32 (closed
   loop: each of C workers sends its next request when the previous one ends), same prompts,
   same ``max_tokens``; constrained requests stop when their JSON is complete, so the figure
   compared is output tokens per second.
2. Compile time of a new schema (the first request's miss) and of the cached second request.
3. The sampler alone, 32 rows of the model's vocabulary: all plain greedy rows vs the same rows
   with one of them carrying a ``logit_bias`` + a grammar mask (what the other rows pay: the
   features cost only the rows that use them), and a batch where every row is constrained.

    python loadtest/bench_structured.py                       # dtype auto
    python loadtest/bench_structured.py --requests 64 --max-tokens 160
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from hermes_async import AsyncEngine
from hermes_async.config import CacheConfig, EngineConfig, ModelConfig
from hermes_async.model.sampler import Sampler, SamplingRequest
from hermes_async.types import GuideKind, SamplingParams, StructuredOutput

SCHEMA = {"type": "object", "properties": {
    "items": {"type": "array", "minItems": 6, "maxItems": 6, "items": {
        "type": "object", "properties": {
            "name": {"type": "string", "minLength": 3, "maxLength": 16},
            "score": {"type": "integer", "minimum": 0, "maximum": 100},
            "tag": {"enum": ["red", "green", "blue"]}},
        "required": ["name", "score", "tag"], "additionalProperties": False}}},
    "required": ["items"], "additionalProperties": False}
ASKS = ["List six fruits with a score.", "Rate six cities as JSON.", "Six animals, scored.",
        "Score six colours.", "Give six tools and a score each.", "Six planets with scores."]


def cpu_line() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in flags.splitlines()
                  if ln.startswith("model name")), platform.processor())
    have = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    return f"{model}; flags: {', '.join(have) or 'none of avx512f/avx512_bf16/amx_bf16'}"


async def closed_loop(engine: AsyncEngine, concurrency: int, requests: int,
                      params: SamplingParams, grammar: Any) -> tuple[float, int]:
    queue = list(range(requests))
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        while queue:
            i = queue.pop()
            ids = await engine.prompt_ids(messages=[{"role": "user",
                                                     "content": ASKS[i % len(ASKS)]}])
            req = engine.add_request(ids, params, grammar=grammar)
            while True:
                out = await req.queue.get()
                tokens += len(out.token_ids)
                if out.usage is not None:
                    break

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return time.perf_counter() - t0, tokens


async def engine_part(args: argparse.Namespace) -> list[str]:
    cfg = EngineConfig(model=ModelConfig(dtype=args.dtype), cache=CacheConfig())
    rows = ["| concurrency | unconstrained tok/s | json_schema tok/s | ratio |",
            "|---|---|---|---|"]
    async with AsyncEngine(cfg) as engine:
        spec = StructuredOutput(GuideKind.JSON, json.dumps(SCHEMA, separators=(",", ":")))
        t0 = time.perf_counter()
        grammar = await engine.compile_grammar(spec)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        await engine.compile_grammar(spec)
        second = time.perf_counter() - t0
        plain = SamplingParams(max_tokens=args.max_tokens, temperature=0.7, seed=1)
        constrained = SamplingParams(max_tokens=args.max_tokens, temperature=0.7, seed=1,
                                     structured=spec)
        await closed_loop(engine, 4, 4, plain, None)  # warm-up
        for conc in (1, 32):
            n = args.requests if conc > 1 else max(4, args.requests // 8)
            results = {}
            for name, p, g in (("plain", plain, None), ("json", constrained, grammar)):
                runs = []
                for _ in range(args.repeat):
                    seconds, tokens = await closed_loop(engine, conc, n, p, g)
                    runs.append(tokens / seconds)
                results[name] = statistics.median(runs)
            rows.append(f"| {conc} | {results['plain']:.1f} | {results['json']:.1f} | "
                        f"{results['json'] / results['plain']:.2f}x |")
        engine.check_integrity()
    rows += ["", f"Compile: first request {first * 1e3:.2f} ms (miss), cached second request "
             f"{second * 1e6:.1f} us (hit)."]
    return rows


class AllowAll:
    """A constraint allowing every token (the mask's cost without changing the choice)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def fill_bitmask(self, row: Any) -> None:
        row[:] = -1


def sampler_part(vocab: int, repeat: int) -> list[str]:
    torch.manual_seed(0)
    full = torch.randn(32, vocab)
    greedy = SamplingParams(temperature=0.0)
    biased = SamplingParams(temperature=0.0, logit_bias=((5, 1.0),))
    cases: dict[str, list[SamplingRequest]] = {
        "31 plain greedy rows": [SamplingRequest(greedy)] * 31,
        "32 plain greedy rows": [SamplingRequest(greedy)] * 32,
        "31 plain + 1 with logit_bias and a mask": [SamplingRequest(greedy)] * 31 + [
            SamplingRequest(biased, constraint=AllowAll(vocab))],
        "32 rows with a mask": [SamplingRequest(greedy, constraint=AllowAll(vocab))] * 32,
    }
    sampler = Sampler()
    rows = ["| sampler batch (32 x vocab) | ms per step |", "|---|---|"]
    for name, reqs in cases.items():
        logits = full[:len(reqs)].contiguous()
        for _ in range(5):
            sampler.sample(logits, reqs)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            sampler.sample(logits, reqs)
            times.append(time.perf_counter() - t0)
        rows.append(f"| {name} | {statistics.median(times) * 1e3:.3f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    print(f"CPU: {cpu_line()}; torch {torch.__version__}; {torch.get_num_threads()} threads")
    for line in asyncio.run(engine_part(args)):
        print(line)
    print()
    for line in sampler_part(49152, 50):
        print(line)


if __name__ == "__main__":
    main()
