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

This script is the entry point; the parts live in modules of their own (import them as
``from serving_sweep import ...`` with ``loadtest/`` on ``sys.path``):

* ``serving_args``: the flags -> :class:`BenchConfig`;
* ``serving_config``: :class:`BenchConfig`, the server's URLs and auth header;
* ``serving_sweep``: the request runner, ``run_benchmark(BenchConfig(...))`` (async);
* ``serving_stats``: ``summarize(records)``, latency percentiles and throughput;
* ``serving_metrics``: the ``/metrics`` scraper (prefix-cache counters, step histograms);
* ``serving_report``: the table and the JSON results file;
* ``openai_stream`` (one timed streamed request) and ``bench_plots`` (``plot_results``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench_plots import plot_results
from serving_args import build_parser, config_from_args
from serving_report import format_table, load_results
from serving_sweep import run_benchmark


def main(argv: list[str] | None = None) -> None:
    args = build_parser(__doc__.split("\n")[0]).parse_args(argv)
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
