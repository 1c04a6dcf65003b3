"""Quantized weights side by side: hermes_async in bfloat16, int8, W8A8 and int4 (and serving
llama.cpp's own Q8_0 and Q4_0 files with ``--quantization gguf``) beside llama.cpp on the same
weights as Q8_0 and Q4_0 GGUF and vLLM's CPU build in bfloat16, one
server at a time, in one run (each server ``--starts`` times, interleaved; the best start's rates).

    loadtest/peers/install.sh vllm llamacpp          # once
    .venv/bin/python loadtest/bench_quant.py --models default qwen3-1.7b --starts 2 \\
        --out-dir loadtest/results/quant --update-benchmarks BENCHMARKS.md

Per model and server: load time, resident memory, prefill tok/s (a ~1000-token prompt),
decode tok/s at concurrency 1 (tokens after the first over the time after it), 8 and 32 (all
tokens over the wall time). ``default`` is the embedded model (its float32 directory served in
bfloat16; its GGUFs written from it); the others are loadtest/shaped_models.py's random weights
in the real models' shapes (speed, not quality: bench_quant_quality.py measures quality).
Beside each row the memory floor at concurrency 1: the bytes of the weights a token reads in
that precision over the read bandwidth measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from bench_models import (
    ModelCase,
    bytes_per_token,
    complete,
    cpu_line,
    merge_starts,
    parse_case,
    port_free,
    prepare,
    read_bandwidth,
    rss_bytes,
    server_command,
    spread,
    text_prompt,
    update_benchmarks,
)
from compare_peers import Started, serve_and_measure

MARK_START, MARK_END = "<!-- quant:start -->", "<!-- quant:end -->"
# (label, server, GGUF type for llama.cpp / hermes quantization, bytes per weight vs bf16)
RUNS = (("hermes bf16", "hermes", "none", 1.0), ("hermes int8", "hermes", "int8", 0.5),
        ("hermes w8a8", "hermes", "w8a8", 0.5), ("hermes int4", "hermes", "int4", 24 / 64),
        # llama.cpp's own files served with --quantization gguf: Q8_0 as int8 in groups of 32
        # (a float32 scale each: 36 bytes a block), Q4_0 as int4 (scale and min: 24 bytes)
        ("hermes gguf Q8_0", "hermes", "gguf:Q8_0", 36 / 64),
        ("hermes gguf Q4_0", "hermes", "gguf:Q4_0", 24 / 64),
        # "+a8": --activations int8 (int8 / int4 weights times int8 activations, blocks of 32;
        # int4's scales and mins float16 for that kernel: 20 bytes a block)
        ("hermes int8 a8", "hermes", "int8+a8", 0.5),
        ("hermes int4 a8", "hermes", "int4+a8", 20 / 64),
        ("hermes gguf Q8_0 a8", "hermes", "gguf:Q8_0+a8", 36 / 64),
        ("hermes gguf Q4_0 a8", "hermes", "gguf:Q4_0+a8", 20 / 64),
        ("vllm bf16", "vllm", "BF16", 1.0), ("llamacpp Q8_0", "llamacpp", "Q8_0", 34 / 64),
        ("llamacpp Q4_0", "llamacpp", "Q4_0", 18 / 64))
CONCURRENCY = (1, 8, 32)


def default_case(work: Path) -> dict[str, Path]:
    """The embedded model's float32 directory and its Q8_0 / Q4_0 / BF16 GGUFs."""
    from hermes_async.model.default_model import fetch_default_model
    from hermes_async.model.gguf.writer import write_gguf

    hf = fetch_default_model(progress=False)
    out = {"hf": hf}
    for qtype in ("BF16", "Q8_0", "Q4_0"):
        path = work / f"default.{qtype}.gguf"
        if not path.is_file():
            print(f"[prepare] default: {qtype} GGUF -> {path}", flush=True)
            part = path.with_suffix(".part")
            write_gguf(hf, part, qtype, tokenizer_dir=hf)
            part.rename(path)
        out[qtype] = path
    return out


async def measure(base: str, model: str, seed: int, decode_tokens: int) -> dict[str, Any]:
    import aiohttp

    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=1800)
    res: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=timeout) as s:
        def go(prompt: str, max_tokens: int) -> Any:
            return complete(s, base, prompt, max_tokens, model)

        await go(text_prompt(rng, 40), 8)  # warm-up
        prefill = [await go(f"{i} " + text_prompt(rng, 1000), 1) for i in range(2)]
        res["prefill_tok_s"] = max(r["prompt"] / r["s"] for r in prefill)
        ttft = min(r["s"] for r in [await go(f"t{i} " + text_prompt(rng, 32), 1)
                                    for i in range(3)])
        c1 = [await go(f"c{i} " + text_prompt(rng, 32), decode_tokens) for i in range(3)]
        res["decode_c1_tok_s"] = max((r["completion"] - 1) / (r["s"] - ttft) for r in c1)
        for c in CONCURRENCY[1:]:
            rounds = []
            for r in range(2):
                t0 = time.perf_counter()
                out = await asyncio.gather(*(go(f"p{c}-{r}-{i} " + text_prompt(rng, 32),
                                                decode_tokens) for i in range(c)))
                rounds.append(sum(x["completion"] for x in out) / (time.perf_counter() - t0))
            res[f"decode_c{c}_tok_s"] = max(rounds)
    return res


def command(server: str, scheme: str, files: dict[str, Path], args: argparse.Namespace
            ) -> tuple[list[str], dict[str, str]]:
    scheme, a8, _ = scheme.partition("+a8")
    extra = ["--activations", "int8"] if a8 else []
    if server == "hermes" and scheme.startswith("gguf:"):  # llama.cpp's file, its blocks kept
        cmd, env = server_command("hermes-gguf", args.port, files, args.threads,
                                  scheme.removeprefix("gguf:"), args.dtype)
        return [*cmd, "--quantization", "gguf", *extra], env
    if server == "hermes":
        cmd, env = server_command("hermes", args.port, files, args.threads, "BF16", args.dtype)
        return ([*cmd, "--quantization", scheme, *extra] if scheme != "none" else cmd), env
    return server_command(server, args.port, files, args.threads, scheme)


def run_one(label: str, server: str, scheme: str, case: str, files: dict[str, Path],
            args: argparse.Namespace) -> dict[str, Any] | None:
    if not port_free(args.port):
        raise SystemExit(f"port {args.port} is in use: stop what listens there first")
    cmd, env = command(server, scheme, files, args)

    def measure_one(started: Started) -> dict[str, Any]:
        res = asyncio.run(measure(started.base, started.model, 7, args.decode_tokens))
        res.update(load_s=started.startup_s, rss_bytes=rss_bytes(started.pid))
        print(f"[{case}] {label}: {json.dumps(res)}", flush=True)
        return res

    slug = label.replace(" ", "-")
    return serve_and_measure(f"{case}] [{label}", cmd, env, args.port,
                             args.out_dir / f"{case}-{slug}.log", args.start_timeout,
                             measure_one)


def report(rows: list[dict[str, Any]], cpu: str, bandwidth: float,
           base_label: str = "hermes bf16") -> str:
    lines = [f"CPU: {cpu}; read bandwidth {bandwidth / 1e9:.1f} GB/s", "",
             "| model | server | load s | RSS GiB | prefill tok/s | c1 tok/s | c8 tok/s | "
             f"c32 tok/s | c1 vs floor | c1 / {base_label} |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        res = row["res"]
        if res is None:
            lines.append(f"| {row['model']} | {row['server']} | failed | | | | | | | |")
            continue
        base = next((r["res"] for r in rows if r["model"] == row["model"]
                     and r["server"] == base_label and r["res"]), None)
        ratio = f"{res['decode_c1_tok_s'] / base['decode_c1_tok_s']:.2f}x" if base else ""
        lines.append(
            f"| {row['model']} | {row['server']} | {res['load_s']:.0f} | "
            f"{res['rss_bytes'] / 2**30:.1f} | {res['prefill_tok_s']:.0f} | "
            f"{spread(res, 'decode_c1_tok_s')} | {spread(res, 'decode_c8_tok_s')} | "
            f"{spread(res, 'decode_c32_tok_s')} | "
            f"{res['decode_c1_tok_s'] / row['floor_tok_s']:.2f} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["default", "qwen3-1.7b"],
                    help="default (the embedded model) or shaped_models names (NAME:LAYERS)")
    ap.add_argument("--runs", nargs="+", default=[r[0] for r in RUNS],
                    choices=[r[0] for r in RUNS])
    ap.add_argument("--starts", type=int, default=1)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/hermes-bench-models"))
    ap.add_argument("--out-dir", type=Path, default=Path("loadtest/results/quant"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--port", type=int, default=8311)
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--update-benchmarks", type=Path, default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="hermes' activations and unquantized weights (float32: the auto "
                    "dtype of CPUs without native bf16; its row is then 'hermes float32')")
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    bandwidth = read_bandwidth()
    base_label = "hermes bf16" if args.dtype == "bfloat16" else "hermes float32"
    runs = [(base_label, s, q, 2.0 if args.dtype == "float32" else w) if label == "hermes bf16"
            else (label, s, q, w) for label, s, q, w in RUNS if label in args.runs]
    rows: list[dict[str, Any]] = []
    for name in args.models:
        if name == "default":
            files, label = default_case(args.work_dir), "default (SmolLM2-135M)"
        else:
            case: ModelCase = parse_case(name)
            files = prepare(case, args.work_dir, True, ("BF16", "Q8_0", "Q4_0"))
            label = case.label
        weight_bytes = bytes_per_token(files["hf"])
        results: dict[str, list[dict[str, Any] | None]] = {r[0]: [] for r in runs}
        for _ in range(args.starts):
            for run_label, server, scheme, _ in runs:
                results[run_label].append(run_one(run_label, server, scheme, name, files, args))
        for run_label, _, _, per_weight in runs:
            rows.append({"model": label, "server": run_label,
                         "floor_tok_s": bandwidth / (weight_bytes * per_weight),
                         "res": merge_starts(results[run_label])})
        (args.out_dir / "results.json").write_text(json.dumps(rows, indent=2))
    text = report(rows, cpu_line(), bandwidth, base_label)
    (args.out_dir / "report.md").write_text(text + "\n")
    print(text)
    if args.update_benchmarks:
        update_benchmarks(args.update_benchmarks, "bench_quant.py", text, MARK_START, MARK_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
