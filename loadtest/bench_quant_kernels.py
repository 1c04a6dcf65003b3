"""One quantized linear, every candidate kernel at a row count, interleaved in one process: where
our int8/int4 GEMVs stop and a dequantized weight's matmul takes over
(``hermes_async.model.attention.native_cpu.quantized_gemv_max_rows``).

    .venv/bin/python loadtest/bench_quant_kernels.py --dtype float32 --shapes 2048x6144,6144x2048 \\
        --rows 1,4,8,12,16,24,32,64,512

Candidates per shape and row count (ms per call, the minimum of ``--repeats`` interleaved calls):
``dense`` (``F.linear`` of the unquantized weight in the dtype: the bytes the schemes save),
``int8`` / ``int4`` (``hermes_native::int8_gemv`` / ``int4_gemv`` over the packed integers),
``int8 deq+mm`` / ``int4 deq+mm`` (``*_dequantize`` into one reused buffer, then ``F.linear``:
what a step of many rows runs), and on AVX2 ``int8 a8`` / ``int4 a8``
(``int8_a8_gemv`` / ``int4_a8_gemv``: the activations quantized to int8 in blocks of 32,
the int4 weight's scales and mins float16 as the runner narrows them, ``int4 a8 f32`` with
float32 ones,
``model.activations = "int8"``; bfloat16 in and out as they are, as the runner calls
them), and where vLLM's CPU library loads ``oneDNN`` (the dense
weight prepacked, as the ``vllm-cpu`` backend runs it) and ``w8a8`` (its ``onednn_scaled_mm``
over per-row int8 activations: the ``w8a8`` scheme). The CPU's flags head the table; the
figures hold for it alone.

Every candidate's weights (tens of MB) stay in a large last-level cache between its calls
(an AMX Xeon's VM shows 300 MiB of L3), where a decode step's come from memory (a 1.7B model
is 1-3 GB): ``--cold`` reads a buffer of ``--evict-mib`` before each timed call, so that
each call streams its weight from memory as a step does.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hermes_async.model.attention import native
from hermes_async.model.cpu_features import current, request_amx
from hermes_async.model.quant.weights import PAIRS, narrow_scales, quantize_int4, quantize_int8


def candidates(weight: torch.Tensor, dtype: torch.dtype, rows: int,
               group: int) -> dict[str, Callable[[torch.Tensor], object]]:
    """name -> a call on ``x [rows, K]`` (the GEMVs only where this CPU has them)."""
    ops = torch.ops.hermes_native
    n, k = weight.shape
    dense = weight.to(dtype)
    q8 = quantize_int8(weight, None, PAIRS)
    q4 = quantize_int4(weight, group, PAIRS)
    out = torch.empty(rows, n, dtype=dtype)
    scratch = torch.empty(n, k, dtype=dtype)

    def int8_deq(x: torch.Tensor) -> object:
        ops.int8_dequantize(scratch, q8.values, q8.scales)
        return F.linear(x, scratch)

    def int4_deq(x: torch.Tensor) -> object:
        ops.int4_dequantize(scratch, q4.values, q4.scales, q4.mins)
        return F.linear(x, scratch)

    calls: dict[str, Callable[[torch.Tensor], object]] = {"dense": lambda x: F.linear(x, dense)}
    if ops.int8_gemv_supported(dtype):
        calls["int8"] = lambda x: ops.int8_gemv(out, x, q8.values, q8.scales)
    calls["int8 deq+mm"] = int8_deq
    if ops.int4_gemv_supported(dtype):
        calls["int4"] = lambda x: ops.int4_gemv(out, x, q4.values, q4.scales, q4.mins)
    calls["int4 deq+mm"] = int4_deq
    if ops.a8_supported():  # int8 activations (quant/a8.py)

        def a8(gemv: Callable[..., object], *tensors: torch.Tensor) -> Callable[..., object]:
            return lambda x: gemv(out, x, *tensors)

        calls["int8 a8"] = a8(ops.int8_a8_gemv, q8.values, q8.scales)
        half = narrow_scales(q4)
        if group % 32 == 0 and half is not None:  # float16 scales and mins, as the runner has
            calls["int4 a8"] = a8(ops.int4_a8_gemv, half.values, half.scales, half.mins)
            calls["int4 a8 f32"] = a8(ops.int4_a8_gemv, q4.values, q4.scales, q4.mins)
    calls.update(onednn_candidates(weight, dtype))
    return calls


def onednn_candidates(weight: torch.Tensor,
                      dtype: torch.dtype) -> dict[str, Callable[[torch.Tensor], object]]:
    """vLLM's oneDNN ops where its CPU library loads: ``oneDNN`` (the dense weight prepacked:
    what the ``vllm-cpu`` backend's linears run) and ``w8a8`` (per-channel int8 weights times
    per-row int8 activations: the ``w8a8`` scheme's ``onednn-w8a8`` path)."""
    try:
        from hermes_async.model.attention.vllm_cpu import load_ops
        from hermes_async.model.layer_ops import OneDnnLinear, OneDnnW8A8
        from hermes_async.model.quant.w8a8 import quantize_w8a8
        vllm_ops = load_ops()
    except (ImportError, OSError, RuntimeError):
        return {}
    dense = OneDnnLinear(vllm_ops, weight.to(dtype).contiguous())
    w8a8 = OneDnnW8A8(vllm_ops, quantize_w8a8(weight), dtype)
    return {"oneDNN": lambda x: dense(x, None), "w8a8": lambda x: w8a8(x, None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--shapes", default="2048x6144,6144x2048", help="NxK,...")
    ap.add_argument("--rows", default="1,4,8,12,16,24,32,64,512")
    ap.add_argument("--group", type=int, default=32, help="int4 group size")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cold", action="store_true",
                    help="evict the caches before each call (weights from memory)")
    ap.add_argument("--evict-mib", type=int, default=1024,
                    help="with --cold: MiB read before each call (several times the LLC)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    native.load()
    request_amx(current())  # before any tile instruction (oneDNN's, vLLM's)
    dtype = getattr(torch, args.dtype)
    evict = torch.ones(args.evict_mib << 18) if args.cold else None  # float32: 4 bytes each
    print(f"{current().kind} ({current().summary()}), {args.threads} threads, {args.dtype}, "
          f"int4 groups of {args.group}; ms per call (min of {args.repeats}"
          f"{f', caches evicted before each: {args.evict_mib} MiB read' if args.cold else ''})\n")
    header: list[str] | None = None
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        weight = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) / k ** 0.5
        for rows in (int(r) for r in args.rows.split(",")):
            calls = candidates(weight, dtype, rows, args.group)
            if header is None:
                header = list(calls)
                print("| N x K, rows | " + " | ".join(header) + " |")
                print("|---|" + "---:|" * len(header))
            x = torch.randn(rows, k).to(dtype)
            best = {name: float("inf") for name in calls}
            for _ in range(args.repeats):
                for name, call in calls.items():
                    if evict is not None:
                        evict.sum()
                    start = time.perf_counter()
                    call(x)
                    best[name] = min(best[name], time.perf_counter() - start)
            fastest = min(best.values())
            cells = [(f"**{best[h] * 1e3:.2f}**" if best[h] == fastest else
                      f"{best[h] * 1e3:.2f}") if h in best else "-" for h in header]
            print(f"| {n} x {k}, {rows} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
