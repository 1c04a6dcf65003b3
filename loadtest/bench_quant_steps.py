"""Decode steps of one model under several weight schemes, interleaved in one process: the
ratios between schemes without the drift that separates two server runs on a VM (25% between
runs of ``bench_quant.py`` on an AMX Xeon, BENCHMARKS.md).

    .venv/bin/python loadtest/bench_quant_steps.py --model /tmp/hermes-bench-models/qwen3-1.7b \\
        --schemes none int8+a8 int4+a8 --batches 1 8 --rounds 12

Each scheme is a :class:`~hermes_async.model.runner.ModelRunner` (``model.quantization``;
``+a8``: ``model.activations = "int8"``) over the same directory, all loaded at once; every
round runs one decode step of each in turn (``--batches`` sequences, each with a
``--context`` of cached tokens), so a slow spell of the machine falls on all of them alike.
Per scheme and batch: the median step, tok/s, and the ratio to the first scheme, plus the
weight bytes a step streams over the median step (GB/s) against the read bandwidth measured
in the same process. The weights' bytes: the quantized weights' (their scales and mins as
held), else the float matmul weights'. And each scheme's own floor: one plain read of the very
tensors its step streams, timed in the same rounds (``own floor ms``), and the share of the step
it is (``of own floor``): the kernels' efficiency with the machine's luck taken out, since on
a VM two allocations of one size read at rates up to 25% apart (where their pages landed),
which a ratio between schemes carries along with their kernels.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.runner import ModelRunner
from hermes_async.step import SequenceStep


def load(model: Path, scheme: str, dtype: str, kv_bytes: int) -> ModelRunner:
    """The runner of ``scheme`` (``none``, ``int8``, ``int4``, ..., ``+a8`` for int8
    activations)."""
    quantization, _, a8 = scheme.partition("+")
    return ModelRunner(model, ModelConfig(dtype=dtype, quantization=quantization,
                                          activations="int8" if a8 == "a8" else "float"),
                       CacheConfig(kv_cache_bytes=kv_bytes))


def block_tables(runner: ModelRunner, batch: int, tokens: int) -> list[tuple[int, ...]]:
    """``batch`` disjoint block tables of ``tokens`` each in ``runner``'s block size (the
    backends' differ)."""
    blocks = -(-tokens // runner.block_size)
    return [tuple(range(i * blocks, (i + 1) * blocks)) for i in range(batch)]


def streamed_bytes(runner: ModelRunner) -> int:
    """Weight bytes one decode step reads: every linear and the LM head once."""
    quantized = runner.model.quantized_weights()
    if quantized:
        return sum(q.nbytes for q in quantized)
    return sum(w.numel() * w.element_size() for w in runner.model.matmul_weights())


def streamed_tensors(runner: ModelRunner) -> list[torch.Tensor]:
    """The tensors of :func:`streamed_bytes`: the quantized weights' integers, scales and
    mins, else the float weights as a one-row step reads them (the GEMV's packed copies where
    the ops hold them)."""
    quantized = runner.model.quantized_weights()
    if quantized:
        return [t for q in quantized for t in (q.values, q.scales, q.mins) if t is not None]
    return [runner.model.ops.decode_copy(w) for w in runner.model.matmul_weights()]


def read_floor(tensors: list[torch.Tensor]) -> None:
    """Read every byte of ``tensors`` once at memory speed (an int32 max: vectorized, no
    float work): the floor of a step that streams them, from the same pages the step reads
    (the VM's bandwidth differs from one allocation to another: up to 25% here)."""
    for t in tensors:
        flat = t.reshape(-1).view(torch.uint8)
        whole = flat.numel() // 4 * 4
        flat[:whole].view(torch.int32).max()
        if whole < flat.numel():
            flat[whole:].max()


def read_bandwidth() -> float:
    """Bytes/s of summing a 1 GiB tensor (best of 5): the memory floor's rate."""
    src = torch.ones(1 << 28)
    best = min(_timed(src.sum) for _ in range(5))
    return src.numel() * 4 / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="HF directory")
    ap.add_argument("--schemes", nargs="+", default=["none", "int8+a8", "int4+a8"])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, default=64, help="cached tokens per sequence")
    ap.add_argument("--rounds", type=int, default=12, help="timed steps per scheme and batch")
    args = ap.parse_args()
    runners = {s: load(args.model, s, args.dtype, 1 << 30) for s in args.schemes}
    for scheme, runner in runners.items():
        print(f"{scheme}: {runner.model.ops.name}; "
              f"{streamed_bytes(runner) / 2**20:.0f} MiB of weights a step")
    bandwidth = read_bandwidth()
    prompt = tuple(range(100, 100 + args.context))
    print(f"\nread bandwidth {bandwidth / 1e9:.1f} GB/s; {args.dtype}; context {args.context}; "
          f"median of {args.rounds} interleaved steps\n")
    print("| scheme | batch | step ms | tok/s | vs first | weights GB/s | of read bw "
          "| own floor ms | of own floor |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    streamed = {s: streamed_tensors(r) for s, r in runners.items()}
    for batch in args.batches:
        tables = {scheme: block_tables(runner, batch, args.context + args.rounds + 3)
                  for scheme, runner in runners.items()}
        for scheme, runner in runners.items():
            for t in tables[scheme]:
                runner.forward([SequenceStep(t, 0, prompt)])
        times: dict[str, list[float]] = {s: [] for s in runners}
        floors: dict[str, list[float]] = {s: [] for s in runners}
        for step in range(args.rounds + 2):  # two warm-up rounds
            for scheme, runner in runners.items():
                steps = [SequenceStep(t, args.context + step, (7,)) for t in tables[scheme]]
                seconds = _timed(lambda r=runner, s=steps: r.forward(s))
                floor = _timed(lambda t=streamed[scheme]: read_floor(t))
                if step >= 2:
                    times[scheme].append(seconds)
                    floors[scheme].append(floor)
        first = statistics.median(times[args.schemes[0]])
        for scheme, runner in runners.items():
            med = statistics.median(times[scheme])
            rate = streamed_bytes(runner) / med
            floor = statistics.median(floors[scheme])
            print(f"| {scheme} | {batch} | {med * 1e3:.1f} | {batch / med:.1f} | "
                  f"{first / med:.2f}x | {rate / 1e9:.1f} | {rate / bandwidth:.2f} | "
                  f"{floor * 1e3:.1f} | {floor / med:.2f} |")


if __name__ == "__main__":
    main()
