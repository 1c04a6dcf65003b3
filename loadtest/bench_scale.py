"""Scale-out benchmark (issue 16): the real default model on Ray Serve, 1 vs 2 engine replicas
and the prefix-aware router vs Ray's power-of-two-choices router, the same workload (same seed)
against each setup in one run. Reports output tok/s, TTFT p50/p99, the cached-token share
(cached prompt tokens / prompt tokens) and requests per replica, plus the ratios
2-replica/1-replica tok/s and prefix/pow2 cached share.

The figures come from (run from the repository root, on a quiet machine):

    .venv/bin/python loadtest/bench_scale.py --setups 1:prefix,2:prefix,2:pow2 \\
        --workload tenants --tenants 8 --system-tokens 400 --concurrency 8 \\
        --num-requests 96 --max-tokens 32 --warmup 4 --seed 0 \\
        --out loadtest/results/bench_scale.json

Each setup (``REPLICAS:ROUTER``) gets a fresh local Ray cluster (``num_cpus`` = replicas + 1,
room for the 0.5-CPU ingress), the app of ``hermes_async.scale.app`` on a free port of 127.0.0.1
(embedded SmolLM2-135M, ``model.num_threads = 1``, ``ray.num_cpus_per_replica = 1``,
``--dtype``, default auto; the KV pool the engine's default, ``cache.kv_cache_memory_fraction``
of the memory free when the replica starts, zero-filled, unless ``--kv-cache-bytes``), a wait
for ``GET /health`` (``--startup-timeout``), a warm-up of ``--warmup`` requests per replica
(workload ``no_reuse``: no prompt shares a KV block with another, so any router spreads them and
the measured run starts with a cold cache), then the measured run through
``serving_sweep.run_benchmark`` (streamed chat, ``ignore_eos``), then ``stop_ray()``. Requests
per replica come from the ingress's ``hermes_routed_requests_total{reason,to}`` (``GET
/metrics`` before and after the run). A setup that fails is reported and skipped. Prints a
markdown table (and the CPU, its bf16/AMX flags, the date); ``--out`` writes everything
(per-request records included) as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from prometheus_client.parser import text_string_to_metric_families
from ray import serve
from serving_config import BenchConfig
from serving_report import write_json
from serving_sweep import run_benchmark

from hermes_async.config import DTYPE_CHOICES, EngineConfig
from hermes_async.model.dtype import NATIVE_BF16_CPU_FLAGS, choose_dtype, read_cpu_flags
from hermes_async.scale.app import APP_NAME, ROUTERS, build_app, start_ray, stop_ray

REPO = Path(__file__).resolve().parents[1]  # on the replicas' PYTHONPATH

ROUTER_NAMES = tuple(ROUTERS)  # prefix, pow2
CPU_FLAGS_OF_INTEREST = (*NATIVE_BF16_CPU_FLAGS, "amx_tile", "amx_int8", "avx512f", "avx2")
ENGINE_PROCESS = f"ray::ServeReplica:{APP_NAME}:engine"
INGRESS_PROCESS = f"ray::ServeReplica:{APP_NAME}:ingress"


class SetupFailed(RuntimeError):
    """A setup did not come up (or its run could not be measured)."""


@dataclass(frozen=True)
class Setup:
    """One benchmarked deployment: ``replicas`` engine replicas behind ``router``."""

    replicas: int
    router: str

    @property
    def name(self) -> str:
        return f"{self.replicas}:{self.router}"

    @property
    def label(self) -> str:
        return f"{self.replicas} replica{'s' if self.replicas > 1 else ''}, {self.router}"


def parse_setups(text: str) -> list[Setup]:
    """``"1:prefix,2:pow2"`` -> the setups, in order."""
    setups = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        count, _, router = item.partition(":")
        router = router or "prefix"
        if not count.isdigit() or int(count) < 1 or router not in ROUTER_NAMES:
            raise argparse.ArgumentTypeError(
                f"bad setup {item!r}: want REPLICAS:ROUTER, ROUTER one of {ROUTER_NAMES}")
        setups.append(Setup(int(count), router))
    if not setups:
        raise argparse.ArgumentTypeError("no setups given")
    return setups


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = ap.add_argument
    a("--setups", type=parse_setups, default=parse_setups("1:prefix,2:prefix,2:pow2"),
      help="REPLICAS:ROUTER,... (ROUTER: prefix or pow2); default 1:prefix,2:prefix,2:pow2")
    a("--workload", default="tenants", help="a name in workloads.WORKLOADS")
    a("--tenants", type=int, default=8, help="tenants workload: system prompts")
    a("--system-tokens", type=int, default=400, help="tokens per system prompt")
    a("--concurrency", type=int, default=8, help="requests in flight")
    a("--num-requests", type=int, default=96, help="measured requests per setup")
    a("--max-tokens", type=int, default=32)
    a("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
      help="always generate max_tokens tokens (default on)")
    a("--warmup", type=int, default=4, help="warm-up requests per replica (not measured)")
    a("--seed", type=int, default=0)
    a("--dtype", choices=DTYPE_CHOICES, default="auto", help="model.dtype")
    a("--num-threads", type=int, default=1, help="model.num_threads of each replica")
    a("--num-cpus-per-replica", type=float, default=1.0, help="ray.num_cpus_per_replica")
    a("--kv-cache-bytes", type=int, default=None,
      help="cache.kv_cache_bytes per replica (default: the engine's, a share of free memory)")
    a("--startup-timeout", type=float, default=300.0, help="seconds to a healthy app")
    a("--timeout", type=float, default=600.0, help="seconds per request")
    a("--out", default="loadtest/results/bench_scale.json", help="JSON results ('' for none)")
    return ap


# ----- the machine ----------------------------------------------------------------------------
def cpu_model() -> str:
    """``lscpu``'s "Model name" (else /proc/cpuinfo's "model name", else platform's)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    with contextlib.suppress(OSError):
        out += Path("/proc/cpuinfo").read_text(errors="replace")
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == "model name":
            return value.strip()
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    flags = set(read_cpu_flags().split())
    return {"cpu": cpu_model(), "logical_cpus": os.cpu_count(),
            "flags": {f: f in flags for f in CPU_FLAGS_OF_INTEREST},
            "auto_dtype_cpu": choose_dtype("cpu", " ".join(flags), False)[1],
            "mem_total_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
                                   / 2**30, 1),
            "python": platform.python_version(), "torch": torch.__version__,
            "ray": ray.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


# ----- processes --------------------------------------------------------------------------------
def descendants(root: int | None = None) -> dict[int, str]:
    """pid -> command line of every process below ``root`` (default: this one), from /proc."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    below, frontier = set(), {root or os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - below
        below |= frontier
    return {pid: cmdline(pid) for pid in sorted(below)}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def memory_mib(pid: int) -> dict[str, float]:
    """Resident (VmRSS) and peak resident (VmHWM) memory of ``pid`` in MiB."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key.lower()] = round(int(value.split()[0]) / 1024, 1)
    except (OSError, ValueError):
        pass
    return out


def replica_memory() -> dict[str, list[dict[str, float]]]:
    """Memory of this run's engine replica and ingress processes."""
    procs = descendants()
    return {kind: [memory_mib(pid) for pid, cmd in procs.items() if cmd.startswith(title)]
            for kind, title in (("engine", ENGINE_PROCESS), ("ingress", INGRESS_PROCESS))}


def wait_ray_gone(timeout_s: float = 60.0) -> list[str]:
    """Wait for this process's Ray children to exit; the ones left after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (left := [f"{pid} {cmd[:80]}" for pid, cmd in descendants().items()]) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


# ----- the app ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_config(args: argparse.Namespace, setup: Setup, port: int) -> EngineConfig:
    cache = {} if args.kv_cache_bytes is None else {"kv_cache_bytes": args.kv_cache_bytes}
    return EngineConfig().replace(
        model={"path": None, "num_threads": args.num_threads, "dtype": args.dtype}, cache=cache,
        server={"host": "127.0.0.1", "port": port},
        ray={"replicas": setup.replicas, "router": setup.router,
             "num_cpus_per_replica": args.num_cpus_per_replica})


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """(status, body) of ``GET url``; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (OSError, ValueError) as e:
        return 0, f"{type(e).__name__}: {e}"


def serve_in_background(config: EngineConfig) -> Future[Any]:
    """``serve.run`` in a daemon thread: it returns once every replica is up, raises when a
    deployment fails, and may block for ever (e.g. resources that never free up)."""
    future: Future[Any] = Future()

    def target() -> None:
        try:
            future.set_result(serve.run(build_app(config), name=APP_NAME, route_prefix="/"))
        except BaseException as e:  # handed to the waiting thread
            future.set_exception(e)

    threading.Thread(target=target, name="serve-run", daemon=True).start()
    return future


def wait_ready(root: str, deployed: Future[Any], timeout_s: float) -> None:
    """Until ``serve.run`` returned and ``GET /health`` answers 200, else :class:`SetupFailed`."""
    deadline = time.monotonic() + timeout_s
    status, body = 0, "serve.run has not returned"
    while time.monotonic() < deadline:
        if deployed.done():
            if (error := deployed.exception()) is not None:
                raise SetupFailed(f"serve.run failed: {type(error).__name__}: {error}")
            status, body = http_get(f"{root}/health")
            if status == 200:
                return
        time.sleep(0.5)
    raise SetupFailed(f"not healthy within {timeout_s:.0f} s (last /health: {status} "
                      f"{body.strip()[:200]})")


def routed_counts(root: str) -> dict[str, dict[str, float]]:
    """``hermes_routed_requests_total`` of the ingress summed by ``to`` and by ``reason``."""
    status, text = http_get(f"{root}/metrics")
    if status != 200:
        raise SetupFailed(f"GET /metrics: {status} {text[:200]}")
    out: dict[str, dict[str, float]] = {"to": {}, "reason": {}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "hermes_routed_requests_total":
                for key in out:
                    label = s.labels.get(key, "?")
                    out[key][label] = out[key].get(label, 0.0) + s.value
    return out


def delta(before: dict[str, dict[str, float]],
          after: dict[str, dict[str, float]]) -> dict[str, dict[str, int]]:
    return {key: {k: round(v - before[key].get(k, 0.0)) for k, v in after[key].items()
                  if v - before[key].get(k, 0.0) > 0} for key in after}


# ----- one setup --------------------------------------------------------------------------------
def bench_config(args: argparse.Namespace, root: str, label: str, *, warmup: int = 0,
                 replicas: int = 1) -> BenchConfig:
    """The measured run, or (``warmup`` > 0) the warm-up: ``warmup`` requests per replica of
    short prompts that share no KV block, ``replicas`` at a time."""
    common = {"base_url": f"{root}/v1", "max_tokens": args.max_tokens, "warmup": 0,
              "ignore_eos": args.ignore_eos, "timeout_s": args.timeout, "label": label}
    if warmup:
        return BenchConfig(workload="no_reuse", concurrency=[replicas],
                           num_requests=warmup * replicas, seed=args.seed + 1, **common)
    params = {"tenants": args.tenants, "system_tokens": args.system_tokens}
    return BenchConfig(workload=args.workload, workload_params=params,
                       concurrency=[args.concurrency], num_requests=args.num_requests,
                       seed=args.seed, **common)


def measure(args: argparse.Namespace, setup: Setup, root: str) -> dict[str, Any]:
    """Warm-up, then the measured run, with the routing counters read around each."""
    out: dict[str, Any] = {}
    before = routed_counts(root)
    if args.warmup:
        t0 = time.monotonic()
        warm = asyncio.run(run_benchmark(bench_config(args, root, f"{setup.name} warm-up",
                                                      warmup=args.warmup,
                                                      replicas=setup.replicas)))
        out["warmup"] = {"seconds": round(time.monotonic() - t0, 1),
                         "errors": warm["points"][0]["summary"]["errors"]}
        middle = routed_counts(root)
        out["warmup"]["routed"] = delta(before, middle)
        before = middle
    result = asyncio.run(run_benchmark(bench_config(args, root, setup.name)))
    out["routed"] = delta(before, routed_counts(root))
    out["memory_mib"] = replica_memory()
    out["result"] = result
    return out


def run_setup(args: argparse.Namespace, setup: Setup) -> dict[str, Any]:
    """One setup from a fresh Ray to ``stop_ray``; failures are recorded, not raised."""
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    record: dict[str, Any] = {"setup": setup.name, "label": setup.label,
                              "replicas": setup.replicas, "router": setup.router,
                              "error": None}
    print(f"\n== {setup.label}: starting Ray and the app on {root}", flush=True)
    t0 = time.monotonic()
    try:
        config = engine_config(args, setup, port)
        start_ray(config, num_cpus=setup.replicas + 1, log_to_driver=False,
                  runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
        record["ray_start_s"] = round(time.monotonic() - t0, 1)
        wait_ready(root, serve_in_background(config), args.startup_timeout)
        record["startup_s"] = round(time.monotonic() - t0, 1)
        print(f"   healthy after {record['startup_s']} s; warm-up and run", flush=True)
        record.update(measure(args, setup, root))
    except Exception as e:  # report it, go on with the next setup
        record["error"] = f"{type(e).__name__}: {e}"
        print(f"   {setup.name} FAILED: {record['error']}", flush=True)
    finally:
        t1 = time.monotonic()
        stop_ray()
        left = wait_ray_gone()
        record["shutdown_s"] = round(time.monotonic() - t1, 1)
        if left:
            record["processes_left"] = left
            print(f"   processes left after stop_ray: {left}", flush=True)
    return record


# ----- the report -------------------------------------------------------------------------------
def summary_of(record: dict[str, Any]) -> dict[str, Any] | None:
    points = (record.get("result") or {}).get("points") or []
    return points[0]["summary"] if points else None


def ratios(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """``"2:prefix/1:prefix"`` tok/s (each multi-replica setup over the 1-replica setup, of
    the same router when there is one) and ``"2:prefix/2:pow2"`` cached share."""
    done = {r["setup"]: (r, s) for r in records if (s := summary_of(r)) is not None}
    out: dict[str, float | None] = {}
    singles = [r for r, _ in done.values() if r["replicas"] == 1]
    for name, (rec, summary) in done.items():
        if rec["replicas"] > 1 and singles:
            base = next((r for r in singles if r["router"] == rec["router"]), singles[0])
            out[f"{name}/{base['setup']} tok/s"] = _ratio(
                summary["output_throughput"], summary_of(base)["output_throughput"])
        if rec["router"] == "prefix" and (other := done.get(f"{rec['replicas']}:pow2")):
            out[f"{name}/{other[0]['setup']} cached share"] = _ratio(
                summary["cached_share"], other[1]["cached_share"])
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _cell(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def per_replica(record: dict[str, Any]) -> str:
    """Measured requests per replica, most first ("8 / 0": the other replica got none)."""
    counts = sorted((record.get("routed") or {}).get("to", {}).values(), reverse=True)
    counts += [0] * (record["replicas"] - len(counts))
    return " / ".join(str(c) for c in counts)


def peak_rss(record: dict[str, Any]) -> str:
    peaks = [m.get("vmhwm") for m in (record.get("memory_mib") or {}).get("engine", [])]
    return " / ".join(f"{p:.0f}" for p in peaks if p is not None) or "-"


def table_row(record: dict[str, Any]) -> str:
    s = summary_of(record)
    if s is None:
        return f"| {record['label']} | failed: {record['error']} |" + " |" * 7
    requests = f"{s['completed']}/{s['requests']}" + (f" ({s['errors']} err)" if s["errors"]
                                                     else "")
    cells = (record["label"], requests, _cell(s["output_throughput"], ".1f"),
             _cell(s["ttft_ms"]["p50"], ".0f"), _cell(s["ttft_ms"]["p99"], ".0f"),
             _cell(s["cached_share"], ".1%"), per_replica(record),
             _cell(record.get("startup_s"), ".0f"), peak_rss(record))
    return "| " + " | ".join(cells) + " |"


def format_report(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in m["flags"].items())
    head = ("| setup | requests | output tok/s | TTFT p50 (ms) | TTFT p99 (ms) | cached share "
            "| requests per replica | startup (s) | peak RSS per replica (MiB) |")
    lines = [f"CPU: {m['cpu']} ({m['logical_cpus']} logical CPUs, {m['mem_total_gib']} GiB)",
             f"flags: {flags}; auto dtype: {m['auto_dtype_cpu']}",
             f"date: {m['date']}; torch {m['torch']}, ray {m['ray']}",
             describe_run(doc["args"]), "", head, "|" + "---|" * 9,
             *(table_row(r) for r in doc["setups"]), ""]
    lines += [f"{k}: {_cell(v, '.2f')}" for k, v in doc["ratios"].items()]
    return "\n".join(lines)


def describe_run(args: dict[str, Any]) -> str:
    return (f"workload {args['workload']} (tenants {args['tenants']}, system tokens "
            f"{args['system_tokens']}), concurrency {args['concurrency']}, "
            f"{args['num_requests']} requests x {args['max_tokens']} tokens, ignore_eos "
            f"{args['ignore_eos']}, seed {args['seed']}; each replica {args['num_threads']} "
            f"torch thread(s), {args['num_cpus_per_replica']} Ray CPU, dtype {args['dtype']}, "
            f"KV pool {args['kv_cache_bytes'] or 'the engine default'} (bytes per replica)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    doc: dict[str, Any] = {"machine": machine_info(), "command": sys.argv,
                           "args": {k: v for k, v in vars(args).items() if k != "setups"}}
    doc["args"]["setups"] = [s.name for s in args.setups]
    if ray.is_initialized():
        raise SystemExit("Ray is already initialized in this process")
    doc["setups"] = [run_setup(args, setup) for setup in args.setups]
    doc["ratios"] = ratios(doc["setups"])
    print("\n" + format_report(doc), flush=True)
    if args.out:
        write_json(doc, Path(args.out))
        print(f"\nwrote {args.out}")
    return 0 if all(r["error"] is None for r in doc["setups"]) else 1


if __name__ == "__main__":
    sys.exit(main())
