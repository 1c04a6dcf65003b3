"""Seeing the caches: rolling hit-rate windows, the cache observer behind ``/cache/stats``,
the dynamic-field (divergence) detector and the offline prompt doctor."""

from hermes_async.observe.divergence import (
    DivergenceDetector,
    DivergencePoint,
    NamespaceDivergence,
)

__all__ = ["DivergenceDetector", "DivergencePoint", "NamespaceDivergence"]
