"""The serving benchmark's request runner: streamed requests at a fixed concurrency or at
Poisson arrivals, one sweep point after another, /metrics scraped around each point.

``run_benchmark(BenchConfig(...))`` (async) returns the result dict (and writes the JSON and the
plots when the config asks for them).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from bench_plots import plot_results
from openai_stream import RequestRecord, stream_chat
from serving_config import BenchConfig, api_root, auth_headers
from serving_metrics import prefix_hit_rate, scrape_prefix_counters, step_profile
from serving_report import format_row, write_json
from serving_stats import summarize
from workloads import Workload, load_tokenizer, make_workload, openai_body


async def fetch_model(session: aiohttp.ClientSession, base: str,
                      headers: dict[str, str]) -> str:
    """The first model of ``GET /v1/models``."""
    async with session.get(f"{base}/models", headers=headers) as resp:
        resp.raise_for_status()
        return (await resp.json())["data"][0]["id"]


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
