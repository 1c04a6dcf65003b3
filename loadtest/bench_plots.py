"""Plots of ``bench_serving`` results, several labelled runs (servers) on the same axes
(import as ``from bench_plots import ...``). A run is the dict ``run_benchmark`` returns or
writes: ``{"label", "points": [{"point": {...}, "summary": {...}}, ...]}``."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

Series = dict[str, list[tuple[float, dict[str, Any]]]]  # line label -> [(x, summary)]


def series(runs: list[dict[str, Any]], x_key: str) -> Series:
    """Points of ``runs`` that have ``x_key``, grouped in lines
    named by the run's label plus the point's other keys, sorted by x."""
    lines: Series = defaultdict(list)
    for run in runs:
        for res in run["points"]:
            point = res["point"]
            if x_key not in point:
                continue
            rest = " ".join(f"{k}={v:g}" for k, v in sorted(point.items()) if k != x_key)
            lines[f"{run['label']} {rest}".strip()].append((point[x_key], res["summary"]))
    return {k: sorted(v, key=lambda p: p[0]) for k, v in lines.items()}


def _draw(ax: Any, lines: Series, metric: Any, ylabel: str, xlabel: str) -> None:
    for name, pts in lines.items():
        xs = [x for x, s in pts if metric(s) is not None]
        ys = [metric(s) for _, s in pts if metric(s) is not None]
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)


def plot_load(runs: list[dict[str, Any]], path: Path, x_key: str = "concurrency") -> Path | None:
    """Output tokens/s, requests/s and TTFT p50 against ``x_key`` (``concurrency`` or
    ``request_rate``); None when no run has such points."""
    lines = series(runs, x_key)
    if not lines:
        return None
    xlabel = "concurrent requests" if x_key == "concurrency" else "request rate (req/s)"
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    _draw(axes[0], lines, lambda s: s["output_throughput"], "output tokens/s", xlabel)
    _draw(axes[1], lines, lambda s: s["request_throughput"], "requests/s", xlabel)
    _draw(axes[2], lines, lambda s: s["ttft_ms"]["p50"], "TTFT p50 (ms)", xlabel)
    xs = sorted({x for pts in lines.values() for x, _ in pts if x != float("inf")})
    for ax in axes:
        ax.set_ylim(bottom=0)
        if x_key == "concurrency" and len(xs) > 1:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.minorticks_off()
    ttfts = [s["ttft_ms"]["p50"] for pts in lines.values() for _, s in pts
             if s["ttft_ms"]["p50"]]
    if ttfts and max(ttfts) > 50 * min(ttfts):  # servers orders of magnitude apart
        axes[2].set_yscale("log")
        axes[2].set_ylim(min(ttfts) / 2, max(ttfts) * 2)
        axes[2].set_ylabel("TTFT p50 (ms, log scale)")
    axes[0].legend(fontsize="small")
    fig.suptitle(f"Throughput and TTFT vs {xlabel}")
    return _save(fig, path)


def plot_ttft_vs_share(runs: list[dict[str, Any]], path: Path) -> Path | None:
    """TTFT p50 against the shared prefix fraction (prefix_share runs); None without any."""
    lines = series(runs, "share")
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    _draw(ax, lines, lambda s: s["ttft_ms"]["p50"], "TTFT p50 (ms)", "shared prefix fraction")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    ax.set_title("Time to first token vs prefix share")
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_results(runs: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Every plot that the runs' points allow, as PNGs in ``out_dir``: ``throughput.png``
    (concurrency sweeps), ``throughput_rate.png`` (request-rate sweeps),
    ``ttft_vs_share.png`` (prefix_share). Returns the paths written."""
    out_dir = Path(out_dir)
    wanted = [plot_load(runs, out_dir / "throughput.png", "concurrency"),
              plot_load(runs, out_dir / "throughput_rate.png", "request_rate"),
              plot_ttft_vs_share(runs, out_dir / "ttft_vs_share.png")]
    return [p for p in wanted if p is not None]
