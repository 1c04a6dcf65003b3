"""Servers side by side in alternating rounds: every server started once (each on its own
port, all up at the same time), then the chosen runs of :mod:`compare_peers`' plan against
each server in turn, round after round (the order reversed every other round: A B, B A, ...),
so that a drift in the machine's speed (a shared host: 10-40% between minutes) falls on every
server alike. Each round uses its own workload seed (fresh prompts, so the prefix cache of an
earlier round cannot serve them); every server sees the same seeds.

    .venv/bin/python loadtest/compare_rounds.py --servers hermes,vllm --runs short@32 \\
        --rounds 5 --dtype bfloat16 --out-dir /tmp/rounds

A server may carry environment settings after ``+`` (``hermes+OMP_WAIT_POLICY=PASSIVE``) and
command-line flags (``hermes+--quantization=int8``): the same server twice with and without a
setting is an A/B of that setting.

Prints, per run, each round's output tok/s and TTFT p50 per server, then the medians and the
ratio of the medians (hermes / peer for tok/s, peer / hermes for TTFT: > 1 means hermes is
better); ``rounds.json`` in ``--out-dir`` keeps every summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from compare_peers import model_paths, plan, server_command, stop, wait_ready
from serving_config import BenchConfig
from serving_sweep import run_benchmark


def parse_label(label: str) -> tuple[str, dict[str, str], list[str]]:
    """``name[+KEY=VALUE...][+--flag=VALUE...]`` -> (server name, extra environment, extra
    command-line arguments): ``hermes+--quantization=int8`` serves with ``--quantization int8``
    (a flag without ``=VALUE`` is passed alone)."""
    name, *settings = label.split("+")
    flags = [s for s in settings if s.startswith("--")]
    env = [s for s in settings if not s.startswith("--")]
    bad = [kv for kv in env if "=" not in kv]
    if bad:
        raise ValueError(f"{label!r}: settings after '+' are KEY=VALUE or --flag[=VALUE], "
                         f"not {bad}")
    args = [part for flag in flags for part in flag.split("=", 1)]
    return name, dict(kv.split("=", 1) for kv in env), args


def start(label: str, port: int, hf: Path, gguf: Path, args: argparse.Namespace,
          out_dir: Path) -> tuple[subprocess.Popen, str]:
    """Start the server ``label`` names (:func:`parse_label`) on ``port``; returns the
    process and the model id it serves."""
    name, settings, flags = parse_label(label)
    cmd, env = server_command(name, port, hf, gguf, args.threads, args.dtype)
    cmd, env = cmd + flags, {**env, **settings}
    log = (out_dir / f"{label.replace('/', '_')}.log").open("w")
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.monotonic()
    model = wait_ready(f"http://127.0.0.1:{port}", proc, args.start_timeout)
    print(f"[{label}] ready on port {port} in {time.monotonic() - t0:.0f} s", flush=True)
    return proc, model


async def one_run(name: str, port: int, model: str, run: Any, seed: int, hf: Path,
                  max_tokens: int) -> dict[str, Any]:
    cfg = BenchConfig(base_url=f"http://127.0.0.1:{port}/v1", model=model,
                      workload=run.workload, workload_params=run.params,
                      concurrency=[run.concurrency], num_requests=run.num_requests,
                      max_tokens=max_tokens, warmup=2, seed=seed, tokenizer=str(hf),
                      label=name)
    res = await run_benchmark(cfg)
    return res["points"][0]["summary"]


def table(runs: list[str], names: list[str], results: dict[str, dict[str, list[dict]]]) -> str:
    """Markdown: each round's figures, then the medians and their ratios."""
    lines = []
    for key in runs:
        lines += [f"**{key}**", "", "| round | " + " | ".join(
            f"{n} tok/s | {n} TTFT p50 (s)" for n in names) + " |",
            "|---" * (1 + 2 * len(names)) + "|"]
        rounds = len(results[names[0]][key])
        for i in range(rounds):
            cells = [f"{results[n][key][i]['output_throughput']:.1f} | "
                     f"{results[n][key][i]['ttft_ms']['p50'] / 1000:.3f}" for n in names]
            lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
        med = {n: (statistics.median(s["output_throughput"] for s in results[n][key]),
                   statistics.median(s["ttft_ms"]["p50"] / 1000 for s in results[n][key]))
               for n in names}
        lines.append("| median | " + " | ".join(f"{med[n][0]:.1f} | {med[n][1]:.3f}"
                                                 for n in names) + " |")
        base = names[0]
        for peer in names[1:]:
            per_round = [results[base][key][i]["output_throughput"]
                         / results[peer][key][i]["output_throughput"] for i in range(rounds)]
            lines += ["", f"{base} / {peer}: tok/s {med[base][0] / med[peer][0]:.2f}x "
                      f"(per round {', '.join(f'{r:.2f}' for r in per_round)}), TTFT p50 "
                      f"{med[peer][1] / med[base][1]:.2f}x (> 1: {base} better)"]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--servers", default="hermes,vllm", help="comma-separated; the first is "
                   "the one the ratios are of")
    p.add_argument("--runs", default="short@32", help="comma-separated keys of "
                   "compare_peers' plan (shared@1, shared@8, shared@32, short@32, ...)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out-dir", default="loadtest/results/rounds")
    p.add_argument("--port", type=int, default=8190)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--start-timeout", type=float, default=400)
    args = p.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [s.strip() for s in args.servers.split(",") if s.strip()]
    by_key = {r.key: r for r in plan(quick=False)}
    runs = [k.strip() for k in args.runs.split(",") if k.strip()]
    unknown = [k for k in runs if k not in by_key]
    if unknown:
        p.error(f"unknown runs {unknown}; known: {', '.join(by_key)}")
    hf, gguf = model_paths()
    procs: dict[str, tuple[subprocess.Popen, str, int]] = {}
    results: dict[str, dict[str, list[dict]]] = {n: {k: [] for k in runs} for n in names}
    try:
        for i, name in enumerate(names):
            proc, model = start(name, args.port + i, hf, gguf, args, out_dir)
            procs[name] = (proc, model, args.port + i)
        for rnd in range(args.rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            for key in runs:
                for name in order:
                    _, model, port = procs[name]
                    summary = asyncio.run(one_run(name, port, model, by_key[key], 1000 + rnd,
                                                  hf, args.max_tokens))
                    results[name][key].append(summary)
                    print(f"round {rnd + 1} {key} {name}: "
                          f"{summary['output_throughput']:.1f} tok/s, TTFT p50 "
                          f"{summary['ttft_ms']['p50'] / 1000:.3f} s", flush=True)
            (out_dir / "rounds.json").write_text(json.dumps(results, indent=1))
    finally:
        for proc, _, _ in procs.values():
            stop(proc)
    body = table(runs, names, results)
    (out_dir / "report.md").write_text(body + "\n")
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
