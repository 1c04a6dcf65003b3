"""The soak's verdict (import as ``from soak_checks import ...``): trend fits over the sampled
series, the checks, the markdown summary and the plot.

A sample is a dict of series (``rss_mb``, ``fds``, ``tasks``, ...) plus ``t`` (seconds since
the traffic started) and ``phase`` (``warmup``, ``soak`` or ``drain``). Trends are fitted over
the ``soak`` samples only (after warm-up, before the traffic stops).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# series -> label of the summary table; the trend-checked ones are in Bounds
SERIES = {
    "rss_mb": "RSS (MiB)", "fds": "open fds", "threads": "threads",
    "tasks": "server-loop tasks", "requests": "engine requests", "running": "running seqs",
    "waiting": "waiting seqs", "kv_free": "KV free", "kv_cached": "KV cached",
    "kv_referenced": "KV referenced", "kv_private": "KV private",
    "client_in_flight": "client requests in flight",
}
ZERO_WHEN_IDLE = ("requests", "running", "waiting", "kv_referenced", "kv_private")


@dataclass(frozen=True)
class Bounds:
    """What counts as a trend (per minute, over the post-warm-up window) and as back to
    baseline. A series fails its trend check only when *both* its fitted slope and the growth
    the fit implies over the whole window pass their bounds (see ``soak.py``'s docstring)."""

    rss_slope_mb_min: float = 5.0
    rss_growth_frac: float = 0.10
    count_slope_min: float = 3.0
    count_growth: float = 8.0
    tasks_slack: int = 2
    fds_slack: int = 4


def slope(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over ``ts`` (units of y per unit of t); 0 for < 3
    points."""
    n = len(ts)
    if n < 3:
        return 0.0
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return 0.0
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var


def series(samples: list[dict[str, Any]], name: str,
           phases: tuple[str, ...] | None = None) -> tuple[list[float], list[float]]:
    pts = [(s["t"], s[name]) for s in samples
           if s.get(name) is not None and (phases is None or s["phase"] in phases)]
    return [p[0] for p in pts], [float(p[1]) for p in pts]


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Verdict:
    checks: list[Check] = field(default_factory=list)
    trends: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


def plateau_window(ts: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """The RSS samples judged: the second half of the post-warm-up window (at least 3).

    Allocator and oneDNN primitive caches make RSS climb at a falling rate until every step
    size has been seen (measured on an AMX Xeon: ~170 MiB over the first ~200 s, then flat;
    longer than a 30 s warm-up), so the fit starts where the climb has had half the window to
    level off. A leak is a straight line: its slope is the same in either half."""
    if len(ts) < 6:
        return ts, ys
    start = len(ts) // 2
    return ts[start:], ys[start:]


def trend_checks(verdict: Verdict, samples: list[dict[str, Any]], bounds: Bounds) -> None:
    """(1) no series trends up after warm-up: RSS, open fds, server-loop tasks."""
    for name in ("rss_mb", "fds", "tasks", "threads"):
        ts, ys = series(samples, name, ("soak",))
        window_min = (ts[-1] - ts[0]) / 60 if ts else 0.0
        first = ys[0] if ys else 0.0
        if name == "rss_mb":  # the slope where the caches levelled off, over the whole window
            ts, ys = plateau_window(ts, ys)
        if len(ts) < 3:
            if name != "threads":
                verdict.add(f"trend {name}", True, "not sampled (skipped)")
            continue
        per_min = slope(ts, ys) * 60
        growth = per_min * window_min
        verdict.trends[name] = {"slope_per_min": per_min, "growth": growth,
                                "window_min": window_min, "start": first}
        if name == "threads":
            continue  # reported, not checked: executors grow threads lazily up to a bound
        if name == "rss_mb":
            start = first
            bad = per_min > bounds.rss_slope_mb_min and growth > bounds.rss_growth_frac * start
            detail = (f"{per_min:+.1f} MiB/min, {growth:+.0f} MiB over {window_min:.1f} min "
                      f"({100 * growth / start:+.1f}%; fails past {bounds.rss_slope_mb_min} "
                      f"MiB/min and {100 * bounds.rss_growth_frac:.0f}%)")
        else:
            bad = per_min > bounds.count_slope_min and growth > bounds.count_growth
            detail = (f"{per_min:+.2f}/min, {growth:+.1f} over {window_min:.1f} min (fails past "
                      f"{bounds.count_slope_min}/min and {bounds.count_growth:+.0f})")
        verdict.add(f"trend {name}", not bad, detail)


def drain_checks(verdict: Verdict, final: dict[str, Any], baseline: dict[str, Any],
                 bounds: Bounds, grace_s: float, waited_s: float) -> None:
    """(2) once the traffic stopped: queues and request-held KV blocks at 0, tasks and fds
    back to baseline plus slack."""
    nonzero = {k: final[k] for k in ZERO_WHEN_IDLE if final.get(k)}
    verdict.add("drain: queues and held KV blocks at 0", not nonzero,
                f"after {waited_s:.1f} s (grace {grace_s:.0f} s): "
                + (", ".join(f"{k}={v:g}" for k, v in nonzero.items()) or
                   ", ".join(f"{k}=0" for k in ZERO_WHEN_IDLE if k in final)))
    for name, slack in (("tasks", bounds.tasks_slack), ("fds", bounds.fds_slack)):
        if final.get(name) is None or baseline.get(name) is None:
            continue
        ok = final[name] <= baseline[name] + slack
        verdict.add(f"drain: {name} back to baseline", ok,
                    f"{final[name]:g} (baseline {baseline[name]:g} + slack {slack})")


def is_idle(sample: dict[str, Any], baseline: dict[str, Any], bounds: Bounds) -> bool:
    if any(sample.get(k) for k in ZERO_WHEN_IDLE):
        return False
    return all(sample.get(k) is None or baseline.get(k) is None
               or sample[k] <= baseline[k] + slack
               for k, slack in (("tasks", bounds.tasks_slack), ("fds", bounds.fds_slack)))


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if isinstance(v, float) and not v.is_integer() else f"{v:g}"


def summary_table(samples: list[dict[str, Any]], verdict: Verdict) -> str:
    """Markdown: first (post-warm-up), last (after the drain), max and the fitted slope of
    every sampled series."""
    lines = ["| series | first | last | max | slope/min |", "|---|---:|---:|---:|---:|"]
    for name, label in SERIES.items():
        _, ys_all = series(samples, name)
        if not ys_all:
            continue
        _, ys_soak = series(samples, name, ("soak",))
        first = ys_soak[0] if ys_soak else ys_all[0]
        trend = verdict.trends.get(name)
        per_min = f"{trend['slope_per_min']:+.2f}" if trend else "-"
        lines.append(f"| {label} | {fmt(first)} | {fmt(ys_all[-1])} | {fmt(max(ys_all))} "
                     f"| {per_min} |")
    return "\n".join(lines)


def checks_table(verdict: Verdict) -> str:
    lines = ["| check | result | detail |", "|---|---|---|"]
    lines += [f"| {c.name} | {'ok' if c.ok else '**FAIL**'} | {c.detail} |"
              for c in verdict.checks]
    return "\n".join(lines)


def plot(samples: list[dict[str, Any]], path: Path, title: str, warmup_s: float,
         duration_s: float) -> Path:
    """Four panels over time: RSS; fds, tasks and threads; KV blocks by state; queues; the
    warm-up and the drain (from the end of the traffic) shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    panels = [("RSS (MiB)", ["rss_mb"]), ("count", ["fds", "tasks", "threads"]),
              ("KV blocks", ["kv_free", "kv_cached", "kv_referenced", "kv_private"]),
              ("requests / sequences", ["requests", "running", "waiting", "client_in_flight"])]
    for ax, (ylabel, names) in zip(axes, panels, strict=True):
        for name in names:
            ts, ys = series(samples, name)
            if ts:
                ax.plot(ts, ys, label=SERIES[name], linewidth=1.2)
        end = max([s["t"] for s in samples] + [duration_s])
        ax.axvspan(0, warmup_s, color="tab:orange", alpha=0.12, linewidth=0)
        ax.axvspan(duration_s, end, color="tab:green", alpha=0.12, linewidth=0)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    axes[0].set_title(title)
    axes[-1].set_xlabel("seconds since the traffic started (orange: warm-up, green: drain)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
