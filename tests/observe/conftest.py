"""Fixtures of the observe tests: the real tokenizer and a prefix-cache simulator."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hermes_async.cache.prefix_tree import PrefixTree
from hermes_async.observe.divergence import DivergenceDetector, DivergencePoint


@pytest.fixture(scope="session")
def tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_dir))


class CacheSim:
    """A real :class:`PrefixTree` (no eviction) feeding true matched lengths to a detector:
    match, observe, then insert the prompt's full blocks (as the engine does after prefill)."""

    def __init__(self, detector: DivergenceDetector) -> None:
        self.detector = detector
        self.tree = PrefixTree(detector.block_size)
        self._blocks = itertools.count()
        self.matched: list[int] = []

    def send(self, token_ids: Sequence[int], namespace: str = "ns") -> DivergencePoint | None:
        ids = list(token_ids)
        bs = self.tree.block_size
        match = self.tree.match(namespace, ids)
        point = self.detector.observe(namespace, ids, match.matched_len)
        new = len(ids) // bs - match.matched_len // bs
        self.tree.insert(namespace, ids[match.matched_len:len(ids) // bs * bs],
                         [next(self._blocks) for _ in range(new)], parent=match.last_node)
        self.matched.append(match.matched_len)
        return point
