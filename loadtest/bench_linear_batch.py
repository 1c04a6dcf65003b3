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

    .venv/bin/python loadtest/bench_linear_batch.py --threads 2 --dtype bfloat16 --ops onednn
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--ops", default="torch", choices=["torch", "onednn", "gemv"])
    parser.add_argument("--unfused", action="store_true")
    parser.add_argument("--per-shape", type=int, default=0, metavar="M",
                        help="also time each distinct weight shape alone at M rows")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    weights = [torch.randn(o, i, dtype=dtype) for o, i in weight_shapes(not args.unfused)]
    linears = prepacked(weights, args.ops) if args.ops != "torch" else None
    numel = sum(w.numel() for w in weights)
    print(f"{len(weights)} matrices, {numel * weights[0].element_size() / 1e6:.0f} MB of "
          f"{args.dtype} weights, {args.threads} threads, {args.ops}")
    print("| M | ms per pass | weights GB/s | GFLOP/s |\n|---:|---:|---:|---:|")
    for m in (int(b) for b in args.batches.split(",")):
        if args.ops == "gemv" and m > 8:
            print(f"| {m} | n/a (the GEMV takes up to 8 rows) | | |")
            continue
        inputs = {n: torch.randn(m, n, dtype=dtype) for n in (HIDDEN, INTERMEDIATE)}
        for _ in range(2):
            one_pass(inputs, weights, linears)
        start = time.perf_counter()
        for _ in range(args.repeats):
            one_pass(inputs, weights, linears)
        seconds = (time.perf_counter() - start) / args.repeats
        print(f"| {m} | {seconds * 1e3:.1f} | "
              f"{numel * weights[0].element_size() / seconds / 1e9:.1f} | "
              f"{2 * m * numel / seconds / 1e9:.0f} |")
    if args.per_shape:
        per_shape(weights, linears, args.per_shape, args.repeats)


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
