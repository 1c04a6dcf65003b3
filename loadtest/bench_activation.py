"""SiLU-and-multiply on the CPU: our kernel (``hermes_native::silu_and_mul``) against vLLM's
(``_C::silu_and_mul``) and plain torch, op by op, then whole runner steps of the default
model with each kernel in the same process (the calls taking turns).

    .venv/bin/python loadtest/bench_activation.py                 # bf16, both parts
    .venv/bin/python loadtest/bench_activation.py --dtype float32 --skip-steps

Op rows: ``[rows, 2 x 1536]`` inputs (the default model's fused gate-up output: 1 and 32 rows
are decode steps, 1056 a prefill step of 12 prompts of 88 tokens). Steps: that prefill step
and a decode step of 32 sequences x 150 cached tokens, on the ``native-cpu`` backend, with its
activation swapped for vLLM's (``vllm``) or left as ours (``native``); medians of ``--rounds``
rounds of two steps each.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from timing import median_seconds

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    return median_seconds(fn, repeat, warmup=3) * 1e3


def op_table(dtype: torch.dtype, repeat: int) -> None:
    from hermes_async.model.attention import native
    from hermes_async.model.attention.vllm_cpu import load_ops

    native.load()
    vllm = load_ops()
    print("| rows | torch ms | vllm ms | native ms | native / vllm | max rel. err native "
          "| max rel. err vllm |\n|---:|---:|---:|---:|---:|---:|---:|")
    for rows in (1, 32, 120, 1056):
        x = torch.randn(rows, 2 * 1536).mul(4).to(dtype)
        ours, theirs = (torch.empty(rows, 1536, dtype=dtype) for _ in range(2))
        gate, up = x.chunk(2, dim=-1)
        t_torch = median_ms(lambda gate=gate, up=up: F.silu(gate) * up, repeat)
        t_vllm = median_ms(lambda x=x, o=theirs: vllm.silu_and_mul(o, x), repeat)
        t_ours = median_ms(lambda x=x, o=ours: torch.ops.hermes_native.silu_and_mul(o, x),
                           repeat)
        g64, u64 = x.double().chunk(2, dim=-1)
        exact = F.silu(g64) * u64
        scale = exact.abs().clamp_min(1e-6)

        def err(out: torch.Tensor, exact=exact, scale=scale) -> float:
            return float(((out.double() - exact).abs() / scale).max())

        print(f"| {rows} | {t_torch:.3f} | {t_vllm:.3f} | {t_ours:.3f} | "
              f"{t_ours / t_vllm:.2f}x | {err(ours):.1e} | {err(theirs):.1e} |")


def step_table(dtype_name: str, rounds: int) -> None:
    from hermes_async.config import CacheConfig, ModelConfig
    from hermes_async.model.default_model import fetch_default_model
    from hermes_async.model.layer_ops import VllmCpuLayerOps
    from hermes_async.model.runner import ModelRunner
    from hermes_async.step import SequenceStep

    runner = ModelRunner(fetch_default_model(progress=False),
                         ModelConfig(dtype=dtype_name, attention_backend="native-cpu"),
                         CacheConfig(kv_cache_bytes=400 << 20))
    ops = runner.model.ops
    kernels = {"vllm": VllmCpuLayerOps.silu_mul.__get__(ops),
               "native": type(ops).silu_mul.__get__(ops)}
    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(i) for i in torch.randint(100, 40000, (n,), generator=gen))

    per = 8  # blocks per sequence
    prefill = [SequenceStep(tuple(range(i * per, (i + 1) * per)), 0, ids(88))
               for i in range(12)]
    tables = [tuple(range((i + 12) * per, (i + 13) * per)) for i in range(32)]
    for t in tables:
        runner.forward([SequenceStep(t, 0, ids(150))])
    decode = [SequenceStep(t, 150, (7,)) for t in tables]
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for case, steps in (("prefill 12 x 88 tokens", prefill), ("decode 32 x 150", decode)):
            for name, fn in kernels.items():
                ops.silu_mul = fn
                runner.forward(steps)
                t0 = time.perf_counter()
                runner.forward(steps)
                runner.forward(steps)
                samples.setdefault((case, name), []).append((time.perf_counter() - t0) / 2)
    print(f"\n{runner.attention.name} backend, {dtype_name}, median of {rounds} rounds\n")
    print("| step | vllm activation ms | native activation ms | change |\n|---|---:|---:|---:|")
    for case in ("prefill 12 x 88 tokens", "decode 32 x 150"):
        a, b = (statistics.median(samples[case, n]) * 1e3 for n in ("vllm", "native"))
        print(f"| {case} | {a:.1f} | {b:.1f} | {(b / a - 1) * 100:+.1f}% |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--skip-steps", action="store_true")
    a = ap.parse_args()
    print(f"{a.dtype}, {torch.get_num_threads()} threads; ms per call (median of {a.repeat})\n")
    op_table(DTYPES[a.dtype], a.repeat)
    if not a.skip_steps:
        step_table(a.dtype, a.rounds)


if __name__ == "__main__":
    main()
