"""Loading a GGUF with its tensors dequantized (``model.quantization = "none"``) against its
blocks kept (``"gguf"``): the peak resident memory and the time of each load, each in a fresh
child process (``ru_maxrss`` of the child: every byte the load touched, the float copy
included where there is one), and the bytes of the weights the model then holds.

    .venv/bin/python loadtest/bench_gguf_load.py /tmp/hermes-bench-models/qwen3-1.7b.Q4_0.gguf \\
        --dtype float32
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
import torch
from hermes_async.model.default_model import hermes_home
from hermes_async.model.gguf.directory import prepare_gguf_dir
from hermes_async.model.loader import load_model
from hermes_async.model.quant.weights import QuantizedWeight
path, dtype, quantization = sys.argv[1:4]
served = prepare_gguf_dir(path, hermes_home())
t = time.perf_counter()
model = load_model(served, dtype, quantization=quantization)
took = time.perf_counter() - t
held = sum(p.numel() * p.element_size() for p in model.parameters())
held += sum(q.nbytes for q in model.quantized_weights())
print(json.dumps({"load_s": took, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                  * 1024, "weights_bytes": held}))
"""


def load_once(path: Path, dtype: str, quantization: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), dtype, quantization],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="+", type=Path)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = ap.parse_args(argv)
    load_once(args.gguf[0], args.dtype, "none")  # prepares the directory; warms the page cache
    print("| file | quantization | load s | peak RSS GiB | weights held GiB |")
    print("|---|---|---:|---:|---:|")
    for path in args.gguf:
        for quantization in ("none", "gguf"):
            r = load_once(path, args.dtype, quantization)
            print(f"| {path.name} | {quantization} | {r['load_s']:.1f} | "
                  f"{r['peak_rss'] / 2**30:.2f} | {r['weights_bytes'] / 2**30:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
