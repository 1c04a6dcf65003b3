"""The serving benchmark's statistics: latency percentiles, throughput and the cached share of
one sweep point's request records."""

from __future__ import annotations

from typing import Any

import numpy as np
from openai_stream import RequestRecord


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
