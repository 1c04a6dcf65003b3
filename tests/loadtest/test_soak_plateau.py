"""The soak's RSS trend is judged where the caches' climb has levelled off: a climb at a
falling rate (allocator and oneDNN caches, as measured on an AMX Xeon) passes, a leak (a
straight line) fails, with the default bounds."""

from __future__ import annotations

import math


def rss_samples(rss_at) -> list[dict]:
    return [{"t": 30.0 + 5 * i, "phase": "soak", "rss_mb": rss_at(30.0 + 5 * i)}
            for i in range(19)]  # 30..120 s, as the 2-minute soak in make test samples


def judge(samples) -> bool:
    from soak_checks import Bounds, Verdict, trend_checks

    verdict = Verdict()
    trend_checks(verdict, samples, Bounds())
    return next(c for c in verdict.checks if c.name == "trend rss_mb").ok


def test_a_levelling_climb_passes_and_a_leak_fails():
    # ~170 MiB over the first 200 s at a falling rate, on 900 MiB
    def climb(t: float) -> float:
        return 900 + 170 * (1 - math.exp(-t / 45))

    def leak(t: float) -> float:
        return 900 + 2.0 * t  # 120 MiB/min

    assert judge(rss_samples(climb))
    assert not judge(rss_samples(leak))
