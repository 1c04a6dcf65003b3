"""The serving benchmark's report: the plain-text table (one row per sweep point) and the JSON
results file (written by ``--out``, read back by ``--compare``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLUMNS = ("server", "point", "ok", "err", "req/s", "out tok/s", "TTFT p50", "p90", "p99",
           "ITL p50", "p99", "E2E p50", "cached", "srv hit")


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


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))


def load_results(paths: list[str | Path]) -> list[dict[str, Any]]:
    """Results written by :func:`serving_sweep.run_benchmark` (``--out``)."""
    return [json.loads(Path(p).read_text()) for p in paths]
