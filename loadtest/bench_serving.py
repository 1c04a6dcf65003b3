"""Serving benchmark against any OpenAI-compatible server: a workload from ``workloads.py``,
streamed chat requests at a fixed concurrency or at Poisson arrivals, swept over points.

Per request: time to first token, inter-token latencies, end-to-end latency, tokens (prompt,
cached, output) from the usage chunk. Per point: percentiles, throughput, the cached share of
prompt tokens, and the server's own prefix-cache hit rate from ``GET /metrics`` when it exports
one (hermes_async's ``hermes_prefix_cache_*_total``, vLLM's ``vllm:prefix_cache_*_total``).
Prints a table, writes JSON (config, summaries, raw records) and PNG plots.

    python loadtest/bench_serving.py --base-url http://127.0.0.1:8000/v1 \\
        --workload shared_system --concurrency 1,4,16 --num-requests 64 --max-tokens 64 \\
        --out results/hermes.json --plot-dir results --label hermes_async
    python loadtest/bench_serving.py --workload prefix_share --share 0,0.25,0.5,0.75,0.9 ...
    python loadtest/bench_serving.py --compare results/hermes.json results/vllm.json \\
        --plot-dir results                       # several servers on the same axes

Library use (the peer comparison): ``run_benchmark(BenchConfig(...))`` (async) returns the
result dict; ``summarize(records)``; ``bench_plots.plot_results(runs, out_dir)``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from bench_plots import plot_results
from openai_stream import RequestRecord, stream_chat
from prometheus_client.parser import text_string_to_metric_families
from workloads import Workload, load_tokenizer, make_workload, openai_body

STEP_SAMPLES = {  # hermes_async's step histograms: what limits a run
    "steps": "hermes_step_seconds_count", "step_seconds": "hermes_step_seconds_sum",
    "step_tokens": "hermes_step_tokens_sum", "step_seqs": "hermes_step_sequences_sum",
}
PREFIX_COUNTERS = {  # exporter: (queries sample, hits sample), both in tokens
    "hermes_async": ("hermes_prefix_cache_queries_total", "hermes_prefix_cache_hits_total"),
    "vllm": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
}


@dataclass
class BenchConfig:
    """One benchmark run: a workload against one server, over the sweep points (the product
    of ``shares`` for prefix_share and ``concurrency`` or ``request_rate``)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str | None = None  # None: the first of GET /v1/models
    api_key: str | None = None
    workload: str = "shared_system"
    workload_params: dict[str, Any] = field(default_factory=dict)
    shares: list[float] | None = None  # prefix_share: one point per share
    concurrency: list[int] | None = None  # requests in flight; default [1]
    request_rate: list[float] | None = None  # requests/s, Poisson arrivals (inf: all at once)
    num_requests: int | None = 32  # per point (None: until duration_s)
    duration_s: float | None = None  # per point: no new request after it
    max_tokens: int = 64
    warmup: int = 2  # requests per point before measuring
    seed: int = 0
    temperature: float | None = 0.0
    ignore_eos: bool = False
    tokenizer: str | None = None  # a local model dir: exact prompt sizes
    timeout_s: float = 600.0
    label: str = "server"
    out: str | None = None  # JSON path
    plot_dir: str | None = None
    keep_text: bool = False  # answers in the JSON records

    def __post_init__(self) -> None:
        if self.concurrency and self.request_rate:
            raise ValueError("give concurrency or request_rate, not both")
        if not self.concurrency and not self.request_rate:
            self.concurrency = [1]
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests or duration_s")


def api_root(base_url: str) -> tuple[str, str]:
    """(the OpenAI base ending in /v1, the server root for /metrics)."""
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return base, base.removesuffix("/v1")


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def fetch_model(session: aiohttp.ClientSession, base: str,
                      headers: dict[str, str]) -> str:
    """The first model of ``GET /v1/models``."""
    async with session.get(f"{base}/models", headers=headers) as resp:
        resp.raise_for_status()
        return (await resp.json())["data"][0]["id"]


def parse_prefix_counters(text: str) -> dict[str, Any] | None:
    """Prefix-cache query and hit tokens (summed over label sets) from Prometheus text, or
    None when no known exporter's counters are there."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name] = samples.get(s.name, 0.0) + s.value
    for source, (queries, hits) in PREFIX_COUNTERS.items():
        if queries in samples and hits in samples:
            out = {"source": source, "queries": samples[queries], "hits": samples[hits]}
            out.update({k: samples[name] for k, name in STEP_SAMPLES.items() if name in samples})
            return out
    return None


def step_profile(before: dict[str, Any] | None, after: dict[str, Any] | None,
                 wall_s: float) -> dict[str, float] | None:
    """Where a hermes_async server's time went between two scrapes: the share of the wall
    time spent in forward steps, and tokens and sequences per step (None for other servers)."""
    if not before or not after or any(k not in before or k not in after for k in STEP_SAMPLES):
        return None
    steps = after["steps"] - before["steps"]
    if steps <= 0:
        return None
    busy = after["step_seconds"] - before["step_seconds"]
    return {"steps": steps, "forward_share": busy / wall_s if wall_s else None,
            "ms_per_step": 1e3 * busy / steps,
            "tokens_per_step": (after["step_tokens"] - before["step_tokens"]) / steps,
            "seqs_per_step": (after["step_seqs"] - before["step_seqs"]) / steps}


async def scrape_prefix_counters(session: aiohttp.ClientSession, root: str,
                                 headers: dict[str, str]) -> dict[str, Any] | None:
    """:func:`parse_prefix_counters` of ``GET {root}/metrics``; None on any failure."""
    try:
        async with session.get(f"{root}/metrics", headers=headers) as resp:
            if resp.status != 200:
                return None
            return parse_prefix_counters(await resp.text())
    except (aiohttp.ClientError, ValueError, OSError):
        return None


def prefix_hit_rate(before: dict[str, Any] | None, after: dict[str, Any] | None) -> float | None:
    """Hit tokens / queried tokens between two scrapes (None without both or no queries)."""
    if not before or not after:
        return None
    queries = after["queries"] - before["queries"]
    return (after["hits"] - before["hits"]) / queries if queries > 0 else None


def stats_ms(values: list[float]) -> dict[str, float | None]:
    """p50, p90, p99 and mean of seconds, in milliseconds (None when empty)."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    a = np.asarray(values) * 1e3
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(a.mean())}


def summarize(records: list[RequestRecord | dict[str, Any]],
              duration_s: float | None = None) -> dict[str, Any]:
    """Latency percentiles (ms), throughput, cached share and errors of a point's records
    (objects or their JSON). ``duration_s``: the point's wall time (default: first send to
    last end)."""
    recs = [r if isinstance(r, dict) else r.to_json() for r in records]
    ok = [r for r in recs if r["error"] is None]
    if duration_s is None and recs:
        duration_s = max(r["start"] + (r["e2e"] or 0) for r in recs) - min(
            r["start"] for r in recs)
    out_tokens = sum(r["output_tokens"] or 0 for r in ok)
    known = [r for r in ok if r["prompt_tokens"] and r["cached_tokens"] is not None]
    tpots = [(r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1) for r in ok
             if r["ttft"] is not None and (r["output_tokens"] or 0) > 1]
    errors = [r["error"] for r in recs if r["error"] is not None]
    rate = (lambda x: x / duration_s) if duration_s else (lambda x: None)
    return {
        "requests": len(recs), "completed": len(ok), "errors": len(errors),
        "error_samples": sorted(set(errors))[:3], "duration_s": duration_s,
        "request_throughput": rate(len(ok)), "output_throughput": rate(out_tokens),
        "ttft_ms": stats_ms([r["ttft"] for r in ok if r["ttft"] is not None]),
        "itl_ms": stats_ms([x for r in ok for x in r["itls"]]),
        "tpot_ms": stats_ms(tpots),
        "e2e_ms": stats_ms([r["e2e"] for r in ok]),
        "prompt_tokens_mean": (float(np.mean([r["prompt_tokens"] for r in ok]))
                               if ok and all(r["prompt_tokens"] for r in ok) else None),
        "output_tokens_mean": out_tokens / len(ok) if ok else None,
        "cached_share": (sum(r["cached_tokens"] for r in known)
                         / sum(r["prompt_tokens"] for r in known) if known else None),
        "server_prefix_hit_rate": None, "metrics_source": None,  # filled by run_point
    }


class RequestSource:
    """Hands out a workload's requests until ``limit`` are out or ``deadline`` passed."""

    def __init__(self, workload: Workload, limit: int | None, deadline: float | None) -> None:
        self.workload, self.limit, self.deadline, self.issued = workload, limit, deadline, 0

    def take(self) -> dict[str, Any] | None:
        if self.limit is not None and self.issued >= self.limit:
            return None
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return None
        self.issued += 1
        return self.workload.next_request()


@dataclass
class Client:
    """What sending a request needs."""

    session: aiohttp.ClientSession
    url: str
    model: str
    headers: dict[str, str]
    config: BenchConfig

    async def send(self, workload: Workload, req: dict[str, Any], index: int) -> RequestRecord:
        """Stream one request and feed its answer back to the workload."""
        body = openai_body(req, self.model, temperature=self.config.temperature,
                           ignore_eos=self.config.ignore_eos)
        rec = await stream_chat(self.session, self.url, body, index=index, meta=req["meta"],
                                headers=self.headers, timeout_s=self.config.timeout_s)
        workload.record_response(req, rec.text if rec.error is None else None)
        return rec


async def run_concurrency(client: Client, source: RequestSource,
                          concurrency: int) -> list[RequestRecord]:
    """``concurrency`` workers, each sending its next request when the last one ends."""
    records: list[RequestRecord] = []

    async def worker() -> None:
        while (req := source.take()) is not None:
            records.append(await client.send(source.workload, req, source.issued - 1))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


async def run_rate(client: Client, source: RequestSource, rate: float,
                   rng: random.Random) -> list[RequestRecord]:
    """Requests sent at Poisson arrivals of ``rate`` per second (all at once when inf)."""
    tasks: list[asyncio.Task[RequestRecord]] = []
    next_at = time.perf_counter()
    while (req := source.take()) is not None:
        tasks.append(asyncio.create_task(client.send(source.workload, req, source.issued - 1)))
        if math.isfinite(rate):
            next_at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    return list(await asyncio.gather(*tasks))


def sweep_points(config: BenchConfig) -> list[dict[str, Any]]:
    """The points of a run, e.g. ``{"share": 0.5, "concurrency": 4}``."""
    loads = ([{"concurrency": c} for c in config.concurrency or []]
             + [{"request_rate": r} for r in config.request_rate or []])
    if config.workload == "prefix_share" and config.shares:
        return [{"share": s, **load} for s in config.shares for load in loads]
    return loads


async def run_point(client: Client, workload: Workload, point: dict[str, Any],
                    root: str) -> dict[str, Any]:
    """Warm-up, then the measured requests of one point, with /metrics scraped around them."""
    cfg = client.config
    if cfg.warmup:
        await run_concurrency(client, RequestSource(workload, cfg.warmup, None),
                              min(cfg.warmup, point.get("concurrency", 1)))
    before = await scrape_prefix_counters(client.session, root, client.headers)
    t0 = time.perf_counter()
    deadline = t0 + cfg.duration_s if cfg.duration_s else None
    source = RequestSource(workload, cfg.num_requests, deadline)
    if "concurrency" in point:
        records = await run_concurrency(client, source, point["concurrency"])
    else:
        records = await run_rate(client, source, point["request_rate"],
                                 random.Random(f"{cfg.seed}:{point}"))
    wall = time.perf_counter() - t0
    after = await scrape_prefix_counters(client.session, root, client.headers)
    records.sort(key=lambda r: r.index)
    for r in records:
        r.start -= t0  # seconds since the point started
    summary = summarize(records, wall)
    summary["server_prefix_hit_rate"] = prefix_hit_rate(before, after)
    summary["server_steps"] = step_profile(before, after, wall)
    summary["metrics_source"] = (after or {}).get("source")
    return {"point": point, "summary": summary,
            "records": [r.to_json(with_text=cfg.keep_text) for r in records]}


def point_name(point: dict[str, Any]) -> str:
    """E.g. "share=0.5 c=4" or "rate=2/s"."""
    parts = []
    if "share" in point:
        parts.append(f"share={point['share']:g}")
    if "concurrency" in point:
        parts.append(f"c={point['concurrency']}")
    if "request_rate" in point:
        parts.append(f"rate={point['request_rate']:g}/s")
    return " ".join(parts)


async def run_benchmark(config: BenchConfig,
                        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every sweep point of ``config`` in order (one workload per share value, carried
    over the load points so a later point continues its request stream); write the JSON and
    the plots when ``config.out`` / ``config.plot_dir`` are set. Returns ``{"label",
    "config", "model", "points": [{"point", "summary", "records"}]}``."""
    base, root = api_root(config.base_url)
    headers = auth_headers(config.api_key)
    tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else None
    workloads: dict[float | None, Workload] = {}
    result: dict[str, Any] = {"label": config.label, "config": asdict(config),
                              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "points": []}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = config.model or await fetch_model(session, base, headers)
        result["model"] = model
        client = Client(session, f"{base}/chat/completions", model, headers, config)
        for point in sweep_points(config):
            share = point.get("share")
            if share not in workloads:
                params = dict(config.workload_params)
                if share is not None:
                    params["share"] = share
                workloads[share] = make_workload(
                    config.workload, strict=False, seed=config.seed,
                    max_tokens=config.max_tokens, tokenizer=tokenizer, **params)
            res = await run_point(client, workloads[share], point, root)
            result["points"].append(res)
            if progress is not None:
                progress(format_row(config.label, res))
    if config.out:
        write_json(result, Path(config.out))
    if config.plot_dir:
        plot_results([result], Path(config.plot_dir))
    return result


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))


def load_results(paths: list[str | Path]) -> list[dict[str, Any]]:
    """Results written by :func:`run_benchmark` (``--out``)."""
    return [json.loads(Path(p).read_text()) for p in paths]


COLUMNS = ("server", "point", "ok", "err", "req/s", "out tok/s", "TTFT p50", "p90", "p99",
           "ITL p50", "p99", "E2E p50", "cached", "srv hit")


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def format_row(label: str, res: dict[str, Any]) -> str:
    """One table row (ms for latencies, shares in %)."""
    s = res["summary"]
    t, i = s["ttft_ms"], s["itl_ms"]
    cells = (label, point_name(res["point"]), str(s["completed"]), str(s["errors"]),
             _fmt(s["request_throughput"], ".2f"), _fmt(s["output_throughput"]),
             _fmt(t["p50"]), _fmt(t["p90"]), _fmt(t["p99"]), _fmt(i["p50"]), _fmt(i["p99"]),
             _fmt(s["e2e_ms"]["p50"], ".0f"), _fmt(s["cached_share"], ".1%"),
             _fmt(s.get("server_prefix_hit_rate"), ".1%"))
    return "  ".join(c.rjust(w) for c, w in zip(cells, _widths(label), strict=True))


def _widths(label: str) -> list[int]:
    return [max(len(label), 6), 16, 4, 4, 6, 9, 8, 8, 8, 7, 7, 7, 7, 7]


def format_table(runs: list[dict[str, Any]]) -> str:
    """Every point of every run as a plain-text table (latencies in ms)."""
    label_w = max([len(r["label"]) for r in runs] + [6])
    head = "  ".join(c.rjust(w) for c, w in zip(COLUMNS, _widths("x" * label_w), strict=True))
    rows = [format_row(r["label"].ljust(label_w), p) for r in runs for p in r["points"]]
    return "\n".join([head, *rows])


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = ap.add_argument
    a("--base-url", default=BenchConfig.base_url, help="OpenAI base URL (…/v1)")
    a("--model", default=None, help="default: the first of GET /v1/models")
    a("--api-key", default=None)
    a("--workload", default="shared_system", help="a name in workloads.WORKLOADS")
    a("--system-tokens", type=int, default=None)
    a("--prompt-tokens", type=int, default=None, help="prefix_share: prompt length")
    a("--share", type=_floats, default=None, help="prefix_share: e.g. 0,0.25,0.5,0.75,0.9")
    a("--users", type=int, default=None, help="multi_turn: conversations")
    a("--turns", type=int, default=None, help="multi_turn: turns per conversation")
    a("--tenants", type=int, default=None)
    a("--param", action="append", default=[], metavar="K=V",
      help="another workload parameter (V as JSON, else a string)")
    a("--tokenizer", default=None, help="local model dir: size prompts in exact tokens")
    a("--concurrency", type=_ints, default=None, help="e.g. 1,8,32")
    a("--request-rate", type=_floats, default=None, help="req/s (Poisson), e.g. 1,2,inf")
    a("--num-requests", type=int, default=None, help="per point (default 32)")
    a("--duration", type=float, default=None, help="seconds per point")
    a("--max-tokens", type=int, default=64)
    a("--warmup", type=int, default=2)
    a("--seed", type=int, default=0)
    a("--temperature", type=float, default=0.0)
    a("--ignore-eos", action="store_true", help="vLLM's extra: always max_tokens tokens")
    a("--timeout", type=float, default=600.0, help="seconds per request")
    a("--label", default="server", help="the server's name in tables and plots")
    a("--out", default=None, help="JSON results")
    a("--plot-dir", default=None)
    a("--keep-text", action="store_true", help="answers in the JSON")
    a("--compare", nargs="+", default=None, metavar="JSON",
      help="only tabulate and plot earlier results together")
    return ap


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    params: dict[str, Any] = {k: getattr(args, k) for k in
                              ("system_tokens", "prompt_tokens", "users", "turns", "tenants")
                              if getattr(args, k) is not None}
    for kv in args.param:
        k, _, v = kv.partition("=")
        try:
            params[k] = json.loads(v)
        except ValueError:
            params[k] = v
    num = args.num_requests
    if num is None and args.duration is None:
        num = 32
    return BenchConfig(
        base_url=args.base_url, model=args.model, api_key=args.api_key,
        workload=args.workload, workload_params=params, shares=args.share,
        concurrency=args.concurrency, request_rate=args.request_rate, num_requests=num,
        duration_s=args.duration, max_tokens=args.max_tokens, warmup=args.warmup,
        seed=args.seed, temperature=args.temperature, ignore_eos=args.ignore_eos,
        tokenizer=args.tokenizer, timeout_s=args.timeout, label=args.label, out=args.out,
        plot_dir=args.plot_dir, keep_text=args.keep_text)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.compare:
        runs = load_results(args.compare)
        print(format_table(runs))
        if args.plot_dir:
            for path in plot_results(runs, Path(args.plot_dir)):
                print(f"wrote {path}")
        return
    config = config_from_args(args)
    print(format_table([{"label": config.label, "points": []}]), flush=True)
    result = asyncio.run(run_benchmark(config, progress=lambda row: print(row, flush=True)))
    print(f"\nmodel {result['model']}, workload {config.workload}, latencies in ms")
    if config.out:
        print(f"wrote {config.out}")
    if config.plot_dir:
        print(f"plots in {config.plot_dir}")


if __name__ == "__main__":
    main()
