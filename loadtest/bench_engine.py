"""Offline throughput of AsyncEngine vs transformers, same model, same run.

Workload: N requests sharing a ~1k-token system prompt, each with its own question, M output
tokens each (EOS ignored so every engine produces the same amount). Reports output tokens/s of
hermes_async (all requests submitted at once), transformers' continuous batching
(``generate_batch``) and sequential ``generate`` (on a subset: a rate is a rate), the time to
first token of a request whose system prompt is cached vs not, and where a step's time goes:
per phase, and per step the forward vs the loop gap (the loop's time not overlapped with a
forward), with overlapped scheduling on and off (``--overlap on off``, the default).

    python loadtest/bench_engine.py                     # dtype auto (the server's), 64 x 128
    python loadtest/bench_engine.py --dtypes float32 bfloat16   # both dtypes
    python loadtest/bench_engine.py --dtypes bfloat16 --requests 32 --max-tokens 64
    python loadtest/bench_engine.py --overlap on --skip-transformers   # overlapped only
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections import defaultdict
from pathlib import Path

import torch

from hermes_async import AsyncEngine
from hermes_async.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from hermes_async.model.dtype import resolve_dtype
from hermes_async.types import SamplingParams

PARAGRAPH = (
    "You are the support assistant of Hermes Logistics. Answer briefly and politely. Our "
    "warehouses are in Lyon, Porto and Gdansk; parcels ship within two working days; returns "
    "are free for thirty days; customers must quote their order number, which has ten digits. "
    "Never promise delivery dates, never share internal notes, and escalate damaged goods to a "
    "human agent. "
)
QUESTIONS = ["Where is my parcel?", "Can I return a lamp?", "Do you ship to Norway?",
             "How long does delivery take?", "What is your refund policy?",
             "My order number has nine digits, is that a problem?", "Is Porto open on Sunday?",
             "Can I change my address?"]


def build_prompts(tokenizer, n: int, system_tokens: int) -> tuple[list[list[int]], int]:
    reps = max(1, system_tokens // len(tokenizer.encode(PARAGRAPH)))
    system = PARAGRAPH * reps
    prompts = []
    for i in range(n):
        q = f"Request {i}: {QUESTIONS[i % len(QUESTIONS)]}"
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": q}]
        prompts.append(list(tokenizer.apply_chat_template(msgs, add_generation_prompt=True,
                                                          tokenize=True, return_dict=False)))
    return prompts, len(tokenizer.encode(system))


def _timed(obj, name: str, record) -> None:
    """Replace ``obj.name`` by a wrapper that calls ``record(start, end)`` after each call."""
    fn = getattr(obj, name)

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            record(t0, time.perf_counter())

    setattr(obj, name, timed)


class StepProfile:
    """Where a step's time goes, collected by wrapping the engine's methods by name.

    ``seconds``: wall time inside each wrapped phase (with overlap the emit runs during the
    next forward, so phases can add up to more than the wall). ``forwards``: each
    ``runner.execute`` call's start and end, taken in the worker thread; the loop gap is the
    time from one forward's end to the next one's start: what the loop does that no forward
    hides (commit, plan, thread hand-offs, and without overlap the emit too).
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.forwards: list[tuple[float, float]] = []

    def wrap(self, obj, name: str, label: str) -> None:
        """Add each call's wall time of ``obj.name`` to the phase ``label``."""
        def add(t0: float, t1: float) -> None:
            self.seconds[label] += t1 - t0

        _timed(obj, name, add)

    def wrap_forward(self, obj, name: str) -> None:
        """Record the start and end of each call of ``obj.name`` (the step's forward)."""
        _timed(obj, name, lambda t0, t1: self.forwards.append((t0, t1)))

    @property
    def steps(self) -> int:
        return len(self.forwards)

    def forward_seconds(self) -> float:
        return sum(end - start for start, end in self.forwards)

    def gap_seconds(self) -> float:
        """Sum of the gaps between consecutive forwards (the engine is busy throughout)."""
        return sum(nxt[0] - prev[1] for prev, nxt in itertools.pairwise(self.forwards))


async def run_hermes(model_dir: Path, dtype: str, prompts, max_tokens: int,
                     overlap: bool = True) -> dict:
    cfg = EngineConfig(model=ModelConfig(path=str(model_dir), dtype=dtype, device="cpu"),
                       cache=CacheConfig(kv_cache_bytes=2 << 30),
                       scheduler=SchedulerConfig(max_num_seqs=len(prompts),
                                                 max_num_batched_tokens=2048,
                                                 overlap=overlap))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    async with AsyncEngine(cfg) as engine:
        async def one(p):
            t0 = time.perf_counter()
            first = None
            n = 0
            async for out in engine.generate(token_ids=p, params=params):
                if first is None and out.token_ids:
                    first = time.perf_counter() - t0
                n += len(out.token_ids)
            return first, n

        await one(prompts[0][-40:])  # warm-up: first touches of the pool, lazy inits
        # TTFT: system prompt not cached, then cached (a different question each time)
        ttft_cold, _ = await one(prompts[0])
        ttft_warm, _ = await one(prompts[1])
        engine.reset_cache()  # the timed run starts with nothing cached
        prof = StepProfile()
        core, ex = engine.core, engine.runner
        prof.wrap(core, "plan_step", "schedule (plan_step)")
        prof.wrap(core, "commit_step", "commit (lengths, blocks, EOS/length ends)")
        prof.wrap(core, "emit_deferred", "emit (detokenize, stops, outputs, queues)")
        prof.wrap_forward(ex, "execute")
        prof.wrap(ex.model_runner, "forward", "forward")
        prof.wrap(ex.sampler, "sample", "sampler")
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in prompts))
        wall = time.perf_counter() - t0
    tokens = sum(n for _, n in results)
    return dict(tokens_per_s=tokens / wall, wall_s=wall, tokens=tokens, ttft_cold=ttft_cold,
                ttft_warm=ttft_warm, profile=dict(prof.seconds), steps=prof.steps,
                forward_s=prof.forward_seconds(), gap_s=prof.gap_seconds())


def python_overhead(model_dir: Path, dtype: str, batch: int, context: int) -> dict:
    """One decode step of ``batch`` sequences under torch's profiler: wall time vs the time
    inside aten ops; the difference is Python and dispatch overhead (reported per layer)."""
    from torch.profiler import profile

    from hermes_async.model.runner import ModelRunner
    from hermes_async.step import SequenceStep

    runner = ModelRunner(model_dir, ModelConfig(dtype=dtype, device="cpu"),
                         CacheConfig(kv_cache_bytes=1 << 30))
    bs = runner.block_size
    per_seq = -(-(context + 2) // bs)
    tables = [tuple(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    ids = tuple(range(100, 100 + context))
    for t in tables:
        runner.forward([SequenceStep(t, 0, ids)])
    steps = [SequenceStep(t, context, (7,)) for t in tables]
    runner.forward(steps)
    with profile() as prof:
        t0 = time.perf_counter()
        runner.forward(steps)
        wall = time.perf_counter() - t0
    in_ops = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6
    layers = runner.spec.num_layers
    return dict(wall_ms=wall * 1e3, ops_ms=in_ops * 1e3,
                overhead_per_layer_us=(wall - in_ops) / layers * 1e6)


def run_transformers_batch(model_dir: Path, dtype: str, prompts, max_tokens: int) -> dict:
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype),
                                                 attn_implementation="sdpa").eval()
    gen = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=-1,
                           pad_token_id=0)
    t0 = time.perf_counter()
    with torch.inference_mode():
        outs = model.generate_batch(inputs=prompts, generation_config=gen, warmup=False)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.generated_tokens) for o in outs.values())
    return dict(tokens_per_s=tokens / wall, wall_s=wall, tokens=tokens)


def run_transformers_sequential(model_dir: Path, dtype: str, prompts, max_tokens: int) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    tokens, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        for p in prompts:
            out = model.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                                 min_new_tokens=max_tokens, pad_token_id=0)
            tokens += out.shape[1] - len(p)
    wall = time.perf_counter() - t0
    return dict(tokens_per_s=tokens / wall, wall_s=wall, tokens=tokens)


def print_step_tables(profiles: dict[tuple[str, str], dict]) -> None:
    """Per phase, then per step: forward vs the loop gap that no forward overlaps."""
    print("\n| dtype | overlap | phase | total s | per step ms | share of wall |")
    print("|---|---|---|---|---|---|")
    for (dtype, mode), r in profiles.items():
        steps = max(r["steps"], 1)
        for phase, secs in sorted(r["profile"].items(), key=lambda kv: -kv[1]):
            print(f"| {dtype} | {mode} | {phase} | {secs:.2f} | {secs / steps * 1e3:.1f} | "
                  f"{secs / r['wall_s']:.0%} |")
    print("\n| dtype | overlap | steps | forward ms/step | loop gap ms/step | "
          "non-forward share of a step | output tok/s |")
    print("|---|---|---|---|---|---|---|")
    for (dtype, mode), r in profiles.items():
        steps = max(r["steps"], 1)
        fwd, gap = r["forward_s"] / steps, r["gap_s"] / max(r["steps"] - 1, 1)
        print(f"| {dtype} | {mode} | {r['steps']} | {fwd * 1e3:.1f} | {gap * 1e3:.2f} | "
              f"{gap / (fwd + gap):.1%} | {r['tokens_per_s']:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--dtypes", nargs="+", default=["auto"],
                    help="auto (the server's default for this CPU), float32, bfloat16")
    ap.add_argument("--overlap", nargs="+", choices=["on", "off"], default=["on", "off"],
                    help="overlapped scheduling (scheduler.overlap) for hermes, each in turn; "
                         "the first is the one compared with transformers")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--system-tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--sequential-requests", type=int, default=3)
    ap.add_argument("--batch-requests", type=int, default=16,
                    help="requests given to generate_batch (64 ran over 10 min on 2 cores)")
    ap.add_argument("--skip-transformers", action="store_true")
    args = ap.parse_args()
    args.dtypes = [resolve_dtype(d, torch.device("cpu"))[0] for d in args.dtypes]
    from transformers import AutoTokenizer

    if args.model is None:
        from hermes_async.model.default_model import fetch_default_model

        args.model = fetch_default_model(progress=False)
    tok = AutoTokenizer.from_pretrained(args.model)
    prompts, sys_len = build_prompts(tok, args.requests, args.system_tokens)
    print(f"{args.requests} requests, system prompt {sys_len} tokens, prompts "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, {args.max_tokens} output "
          f"tokens each, torch threads {torch.get_num_threads()}\n")
    print("| dtype | engine | output tok/s | wall s | hermes / engine |")
    print("|---|---|---|---|---|")
    profiles: dict[tuple[str, str], dict] = {}
    for dtype in args.dtypes:
        ours = None
        for mode in args.overlap:
            r = asyncio.run(run_hermes(args.model, dtype, prompts, args.max_tokens,
                                       overlap=mode == "on"))
            profiles[dtype, mode] = r
            ours = ours or r
            print(f"| {dtype} | hermes_async AsyncEngine, overlap {mode} | "
                  f"{r['tokens_per_s']:.1f} | {r['wall_s']:.1f} | "
                  f"{ours['tokens_per_s'] / r['tokens_per_s']:.2f}x |", flush=True)
        if args.skip_transformers:
            continue
        others = [(f"transformers generate_batch ({args.batch_requests} req)",
                   run_transformers_batch, prompts[: args.batch_requests]),
                  (f"transformers generate, sequential ({args.sequential_requests} req)",
                   run_transformers_sequential, prompts[: args.sequential_requests])]
        for name, fn, subset in others:
            try:
                r = fn(args.model, dtype, subset, args.max_tokens)
            except Exception as e:  # a baseline that fails is reported, not fatal
                print(f"| {dtype} | {name} | failed: {type(e).__name__}: {e} | | |", flush=True)
                continue
            print(f"| {dtype} | {name} | {r['tokens_per_s']:.1f} | {r['wall_s']:.1f} | "
                  f"{ours['tokens_per_s'] / r['tokens_per_s']:.2f}x |", flush=True)
    print("\n| dtype | overlap | TTFT, system prompt not cached | TTFT, cached | ratio |")
    print("|---|---|---|---|---|")
    for (dtype, mode), r in profiles.items():
        print(f"| {dtype} | {mode} | {r['ttft_cold'] * 1e3:.0f} ms | "
              f"{r['ttft_warm'] * 1e3:.0f} ms | {r['ttft_warm'] / r['ttft_cold']:.3f} |")
    print("\n| dtype | decode step (batch 8, 256-token context) | wall ms | in aten ops ms | "
          "Python + dispatch overhead per layer |")
    print("|---|---|---|---|---|")
    for dtype in args.dtypes:
        o = python_overhead(args.model, dtype, 8, 256)
        print(f"| {dtype} | unshared contexts | {o['wall_ms']:.1f} | {o['ops_ms']:.1f} | "
              f"{o['overhead_per_layer_us']:.0f} us |")
    print_step_tables(profiles)


if __name__ == "__main__":
    main()
