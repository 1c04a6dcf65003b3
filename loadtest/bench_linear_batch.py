"""How long the default model's linear layers take per decode step, by batch size: the floor
under a decode step's time on a CPU (issue 14's "short prompts at 32" profile).

One pass multiplies ``M`` rows by every weight matrix of SmolLM2-135M (30 layers of qkv, o,
gate-up and down as the engine fuses them, or ``--unfused`` q, k, v, o, gate, up, down; plus
the LM head) in the given dtype, with ``torch.nn.functional.linear`` (``--ops torch``), with
what the engine's CPU backends run (``--ops onednn``: vLLM's oneDNN matmuls over weights
prepacked once, :class:`hermes_async.model.layer_ops.OneDnnLinear`) or with our GEMV for up to
8 rows (``--ops gemv``: ``hermes_native::gemv_packed``). Prints ms per pass, the
weight bytes streamed per second and GFLOP/s per ``M``: where the time stays flat as ``M``
grows the step is bound by reading the weights from memory, where it grows with ``M`` by the
matmuls themselves.

    .venv/bin/python loadtest/bench_linear_batch.py --threads 2 --dtype bfloat16 --ops onednn,gemv
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

HIDDEN, INTERMEDIATE, LAYERS, KV_DIM, VOCAB = 576, 1536, 30, 192, 49152


def weight_shapes(fused: bool = True) -> list[tuple[int, int]]:
    """(out, in) of every linear layer of SmolLM2-135M, the LM head last; ``fused``: q, k, v
    as one matrix and gate, up as one, as the engine multiplies them."""
    if fused:
        per_layer = [(HIDDEN + 2 * KV_DIM, HIDDEN), (HIDDEN, HIDDEN),
                     (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]
    else:
        per_layer = [(HIDDEN, HIDDEN), (KV_DIM, HIDDEN), (KV_DIM, HIDDEN), (HIDDEN, HIDDEN),
                     (INTERMEDIATE, HIDDEN), (INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]
    return per_layer * LAYERS + [(VOCAB, HIDDEN)]


def one_pass(inputs: dict[int, torch.Tensor], weights: list[torch.Tensor],
             linears: list | None = None) -> None:
    """Every weight once, each on an input as wide as its ``in`` dimension (through its
    prepacked ``linears`` entry when given)."""
    for i, w in enumerate(weights):
        if linears is None:
            torch.nn.functional.linear(inputs[w.shape[1]], w)
        else:
            linears[i](inputs[w.shape[1]], None)


def prepacked(weights: list[torch.Tensor], kind: str) -> list:
    """Each weight prepacked for vLLM's oneDNN matmul (``onednn``, as the engine's CPU
    backends run more than 8 rows) or for our GEMV (``gemv``, bf16 decode steps of up to 8
    rows on the native-cpu backend)."""
    if kind == "gemv":
        from hermes_async.model.attention import native

        native.load()
        ops = torch.ops.hermes_native

        def gemv(packed: torch.Tensor, n: int):
            def call(x: torch.Tensor, bias: None) -> torch.Tensor:
                out = torch.empty(x.shape[0], n, dtype=x.dtype)
                ops.gemv_packed(out, x, packed)
                return out
            return call

        return [gemv(ops.pack_for_gemv(w), w.shape[0]) for w in weights]
    from hermes_async.model.attention.vllm_cpu import load_ops
    from hermes_async.model.layer_ops import OneDnnLinear

    ops = load_ops()
    return [OneDnnLinear(ops, w) for w in weights]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batches", default="1,8,16,32,64,128")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ops", default="torch",
                        help="torch, onednn or gemv; several (comma-separated) take turns "
                        "pass by pass, one column each")
    parser.add_argument("--unfused", action="store_true")
    parser.add_argument("--per-shape", type=int, default=0, metavar="M",
                        help="also time each distinct weight shape alone at M rows (the "
                        "first --ops)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    kinds = [k.strip() for k in args.ops.split(",") if k.strip()]
    unknown = set(kinds) - {"torch", "onednn", "gemv"}
    if unknown:
        parser.error(f"unknown --ops {sorted(unknown)}")
    weights = [torch.randn(o, i, dtype=dtype) for o, i in weight_shapes(not args.unfused)]
    linears = {k: prepacked(weights, k) if k != "torch" else None for k in kinds}
    numel = sum(w.numel() for w in weights)
    nbytes = numel * weights[0].element_size()
    print(f"{len(weights)} matrices, {nbytes / 1e6:.0f} MB of {args.dtype} weights, "
          f"{args.threads} threads; ms per pass (median of {args.repeats}, weights GB/s, "
          f"GFLOP/s)\n")
    print("| M | " + " | ".join(kinds) + " |\n|---:|" + "---:|" * len(kinds))
    for m in (int(b) for b in args.batches.split(",")):
        inputs = {n: torch.randn(m, n, dtype=dtype) for n in (HIDDEN, INTERMEDIATE)}
        runnable = [k for k in kinds if k != "gemv" or m <= 8]
        samples: dict[str, list[float]] = {k: [] for k in runnable}
        for k in runnable:
            for _ in range(2):
                one_pass(inputs, weights, linears[k])
        for _ in range(args.repeats):
            for k in runnable:
                start = time.perf_counter()
                one_pass(inputs, weights, linears[k])
                samples[k].append(time.perf_counter() - start)
        cells = []
        for k in kinds:
            if k not in samples:
                cells.append("n/a (up to 8 rows)")
                continue
            sec = statistics.median(samples[k])
            cells.append(f"{sec * 1e3:.1f} ({nbytes / sec / 1e9:.1f} GB/s, "
                         f"{2 * m * numel / sec / 1e9:.0f})")
        print(f"| {m} | " + " | ".join(cells) + " |")
    if args.per_shape:
        per_shape(weights, linears[kinds[0]], args.per_shape, args.repeats)


def per_shape(weights: list[torch.Tensor], linears: list | None, m: int,
              repeats: int) -> None:
    """Each distinct shape once at ``m`` rows: ms per call, GFLOP/s, ms in one pass."""
    print(f"\n| shape (out x in) at M={m} | ms per call | GFLOP/s | calls per pass | "
          f"ms per pass |\n|---|---:|---:|---:|---:|")
    seen: dict[tuple[int, int], int] = {}
    for i, w in enumerate(weights):
        seen.setdefault(tuple(w.shape), i)
    counts = {shape: sum(tuple(w.shape) == shape for w in weights) for shape in seen}
    for shape, i in seen.items():
        x = torch.randn(m, shape[1], dtype=weights[i].dtype)
        w = weights[i]

        def call(x=x, w=w, i=i) -> object:
            return (torch.nn.functional.linear(x, w) if linears is None
                    else linears[i](x, None))

        for _ in range(3):
            call()
        start = time.perf_counter()
        for _ in range(repeats * 4):
            call()
        sec = (time.perf_counter() - start) / (repeats * 4)
        print(f"| {shape[0]} x {shape[1]} | {sec * 1e3:.3f} | "
              f"{2 * m * shape[0] * shape[1] / sec / 1e9:.0f} | {counts[shape]} | "
              f"{sec * counts[shape] * 1e3:.1f} |")


if __name__ == "__main__":
    main()
