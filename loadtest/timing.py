"""Wall-clock sampling shared by the benchmark scripts (import as ``from timing import ...``:
the scripts run as ``python loadtest/NAME.py``, which puts this folder on ``sys.path``)."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable


def sample_seconds(fn: Callable[[], object], repeats: int, *, warmup: int = 0,
                   setup: Callable[[], object] | None = None, pause_gc: bool = False,
                   sync: Callable[[], object] | None = None) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones.

    ``setup`` runs untimed before each call; ``pause_gc`` collects garbage, then keeps the
    collector off while timing; ``sync`` (e.g. ``torch.cuda.synchronize``) runs inside the
    timed span so device work is counted.
    """
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    samples = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        if pause_gc:
            gc.collect()
            gc.disable()
        try:
            t0 = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            samples.append(time.perf_counter() - t0)
        finally:
            if pause_gc:
                gc.enable()
    return samples


def median_seconds(fn: Callable[[], object], repeats: int, **options: object) -> float:
    """Median of :func:`sample_seconds` (same options)."""
    return statistics.median(sample_seconds(fn, repeats, **options))  # type: ignore[arg-type]
