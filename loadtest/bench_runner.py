"""Runner benchmark: hermes_async's paged runner vs transformers' model, same weights, same run.

Measures prefill of N tokens and decode steps at several batch sizes, in the given dtypes
(default ``auto``: the server's choice for this machine, see hermes_async/model/dtype.py),
and the machine's matmul rate in the same process so every figure is also a fraction of that
roofline. Prints a markdown table (and writes JSON with --json).

    python loadtest/bench_runner.py                      # default model, dtype auto
    python loadtest/bench_runner.py --dtypes float32 bfloat16   # both, one process each
    python loadtest/bench_runner.py --model DIR --dtypes bfloat16 --batches 1 8 --repeat 3
    python loadtest/bench_runner.py --backends torch vllm-cpu native-cpu   # attention backends

Cases: ``prefill`` (``--prompt-len`` fresh tokens), ``prefill_cached`` (the same number of new
tokens after ``--cached-len`` cached ones: a prompt behind a shared system prompt) and
``decode_bN`` (one step of N sequences, each with a ``--prompt-len`` context).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from timing import median_seconds

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.dtype import resolve_dtype
from hermes_async.model.runner import ModelRunner
from hermes_async.model.spec import read_spec
from hermes_async.step import SequenceStep

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def best_of(fn, repeat: int) -> float:
    """Median wall time of ``repeat`` calls after one warm-up (device work included)."""
    return median_seconds(fn, repeat, warmup=1, sync=sync)


def matmul_rate(dtype: torch.dtype, device: str, n: int = 2048, repeat: int = 5) -> float:
    """Measured FLOP/s of an ``n x n`` matmul: the roofline the figures are compared with."""
    if device != "cpu":
        n = 8192
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    seconds = best_of(lambda: torch.mm(a, b), repeat)
    return 2 * n**3 / seconds


def model_flops(spec, new_tokens: int, context: int, seqs: int) -> float:
    """Matmul FLOPs of one step: weights x tokens, attention scores/values, LM head per seq."""
    per_layer = spec.hidden_size * (spec.q_size + 2 * spec.kv_size) + spec.q_size * \
        spec.hidden_size + 3 * spec.hidden_size * spec.intermediate_size
    weights = 2 * per_layer * spec.num_layers * new_tokens * seqs
    # each new token attends to ~context keys (causal prefill: half on average)
    keys = context if new_tokens == 1 else context / 2
    attn = 4 * spec.num_layers * spec.q_size * keys * new_tokens * seqs
    head = 2 * spec.hidden_size * spec.vocab_size * seqs
    return weights + attn + head


def run_hermes(model_dir: Path, dtype: str, prompt_len: int, batches: list[int], steps: int,
               repeat: int, device: str, backend: str = "auto",
               cached_len: int = 1024) -> tuple[dict, object]:
    spec = read_spec(model_dir)
    per_token = 2 * spec.num_layers * spec.kv_size * DTYPES[dtype].itemsize
    tokens = (max(batches) + 1) * (prompt_len + steps + 256) + cached_len + prompt_len + 256
    runner = ModelRunner(model_dir, ModelConfig(dtype=dtype, device=device,
                                                attention_backend=backend),
                         CacheConfig(kv_cache_bytes=tokens * per_token))
    bs = runner.block_size
    per_seq = -(-(prompt_len + steps + 1) // bs)
    ids = tuple(int(i) for i in torch.randint(100, 40000, (prompt_len,)))
    table0 = tuple(range(per_seq))
    out = {"prefill": best_of(lambda: runner.forward([SequenceStep(table0, 0, ids)]), repeat)}
    first = (max(batches) + 1) * per_seq  # blocks after every decode sequence's
    cached = tuple(int(i) for i in torch.randint(100, 40000, (cached_len,)))
    table_c = tuple(range(first, first + -(-(cached_len + prompt_len) // bs)))
    runner.forward([SequenceStep(table_c, 0, cached)])
    out["prefill_cached"] = best_of(
        lambda: runner.forward([SequenceStep(table_c, cached_len, ids)]), repeat)
    for b in batches:
        tables = [tuple(range(i * per_seq, (i + 1) * per_seq)) for i in range(b)]
        for t in tables:
            runner.forward([SequenceStep(t, 0, ids)])

        def decode(tables=tables):
            for s in range(steps):
                runner.forward([SequenceStep(t, prompt_len + s, (7,)) for t in tables])

        out[f"decode_b{b}"] = best_of(decode, repeat) / steps
    return out, runner.spec


def run_transformers(model_dir: Path, dtype: str, prompt_len: int, batches: list[int],
                     steps: int, repeat: int, device: str) -> dict:
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).eval()
    model = model.to(device)
    ids = torch.randint(100, 40000, (1, prompt_len), device=device)
    out = {}
    with torch.inference_mode():
        out["prefill"] = best_of(lambda: model(ids, logits_to_keep=1), repeat)
        for b in batches:
            batch = ids.expand(b, -1).contiguous()
            tok = torch.full((b, 1), 7, device=device)

            def decode(batch=batch, tok=tok):
                cache = DynamicCache()
                model(batch, past_key_values=cache, use_cache=True, logits_to_keep=1)
                t0 = time.perf_counter()
                for _ in range(steps):
                    model(tok, past_key_values=cache, use_cache=True)
                sync()
                return time.perf_counter() - t0

            decode()
            out[f"decode_b{b}"] = statistics.median(decode() for _ in range(repeat)) / steps
    return out


def worker(args: argparse.Namespace, kind: str, dtype: str, backend: str = "auto"):
    cmd = [sys.executable, __file__, "--worker", kind, "--dtypes", dtype, "--model",
           str(args.model), "--prompt-len", str(args.prompt_len), "--steps", str(args.steps),
           "--repeat", str(args.repeat), "--device", args.device, "--backends", backend,
           "--cached-len", str(args.cached_len), "--batches", *map(str, args.batches)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="HF dir (default: embedded model)")
    ap.add_argument("--dtypes", nargs="+", default=["auto"],
                    help="auto (the server's default), float32, bfloat16, float16 (CUDA)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--steps", type=int, default=8, help="decode steps per measurement")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--backends", nargs="+", default=["auto"],
                    help="attention backends to measure (auto, torch, vllm-cpu, native-cpu, ...)")
    ap.add_argument("--cached-len", type=int, default=1024,
                    help="cached tokens before the prefill_cached case's new tokens")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--worker", choices=["hermes", "transformers", "roofline"],
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.dtypes = [resolve_dtype(d, torch.device(args.device))[0] for d in args.dtypes]
    if args.model is None:
        from hermes_async.model.default_model import fetch_default_model

        args.model = fetch_default_model()
    if args.worker:  # one measurement in a fresh process, printed as JSON
        fn = {"hermes": run_hermes, "transformers": run_transformers,
              "roofline": None}[args.worker]
        dtype = args.dtypes[0]
        if fn is None:
            out = matmul_rate(DTYPES[dtype], args.device)
        elif args.worker == "hermes":
            out = fn(args.model, dtype, args.prompt_len, args.batches, args.steps, args.repeat,
                     args.device, args.backends[0], args.cached_len)[0]
        else:
            out = fn(args.model, dtype, args.prompt_len, args.batches, args.steps, args.repeat,
                     args.device)
        print("RESULT " + json.dumps(out))
        return
    rows, record = [], {"torch_threads": torch.get_num_threads(), "results": []}
    spec = read_spec(args.model)
    for dtype in args.dtypes:
        # Each measurement in its own process: in one process, bfloat16 after float32 ran
        # up to 30x slower (allocator / kernel state left behind), which no user would see.
        peak = worker(args, "roofline", dtype)
        ref = {} if args.skip_transformers else worker(args, "transformers", dtype)
        for backend in args.backends:
            ours = worker(args, "hermes", dtype, backend)
            for key in ours:
                b = 1 if key.startswith("prefill") else int(key.split("_b")[1])
                n_new = args.prompt_len if key.startswith("prefill") else 1
                context = args.prompt_len
                if key == "prefill_cached":  # new tokens attend to the cached ones too
                    context = args.cached_len + args.prompt_len
                flops = model_flops(spec, n_new, context, b)
                if key == "prefill_cached":  # model_flops halves keys for a causal prefill
                    flops += 4 * spec.num_layers * spec.q_size * n_new * args.cached_len / 2
                tok_s = n_new * b / ours[key]
                r = ref.get(key)
                rows.append((dtype, backend, key, b, ours[key] * 1e3,
                             r * 1e3 if r else None, r / ours[key] if r else None, tok_s,
                             flops / ours[key] / peak, peak / 1e9))
                record["results"].append(dict(
                    dtype=dtype, backend=backend, case=key, hermes_ms=ours[key] * 1e3,
                    transformers_ms=r * 1e3 if r else None, roofline_gflops=peak / 1e9,
                    roofline_fraction=flops / ours[key] / peak))
    print(f"device {args.device}, torch threads: {torch.get_num_threads()}, "
          f"prompt {args.prompt_len} tokens, "
          f"{args.steps} decode steps per sample, median of {args.repeat}\n")
    print("| dtype | attention | case | batch | hermes ms/step | transformers ms/step | "
          "speed-up | hermes tok/s | hermes % of matmul roofline | roofline GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ref_ms = f"{r[5]:.1f}" if r[5] is not None else "-"
        speed = f"{r[6]:.2f}x" if r[6] is not None else "-"
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.1f} | {ref_ms} | {speed} | "
              f"{r[7]:.0f} | {100 * r[8]:.0f}% | {r[9]:.0f} |")
    if args.json:
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
