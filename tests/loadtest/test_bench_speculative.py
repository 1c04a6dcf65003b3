"""bench_speculative's interleaving: every arm runs every cell's rounds, a round at a time on
each arm in an order that rotates, and a cell's figure is the median of its rounds."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import pytest


def test_arms_take_turns_round_by_round(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench_speculative as bench
    from compare_peers import Started

    calls: list[tuple[str, str, int, int]] = []
    speed = {"a": 10.0, "b": 20.0, "c": 30.0}

    async def fake_round(session: Any, base: str, model: str, workload: str, concurrency: int,
                         max_tokens: int, offset: int) -> dict[str, float]:
        label = base.rsplit("/", 1)[1]
        calls.append((label, workload, concurrency, offset))
        tok_s = speed[label] + offset / 100  # rounds 0, 1, 2: +0, +1, +2
        return {"tok_s": tok_s, "tokens": 10, "seconds": 10 / tok_s, "drafts": 1,
                "drafted": 4, "accepted": 2}

    monkeypatch.setattr(bench, "round_of", fake_round)
    servers = {label: Started(f"http://x/{label}", "m", 0, 0.0) for label in speed}
    args = argparse.Namespace(workloads=["repeat", "open"], concurrency=[1, 8], rounds=3,
                              max_tokens=16)
    out = asyncio.run(bench.measure(servers, args))

    measured = [c for c in calls if c[3] != 10_000]  # not the warm-up
    assert len(measured) == 3 * 2 * 2 * 3  # arms x workloads x concurrencies x rounds
    # one round of a cell on every arm before that cell's next round, arms' order rotating
    first_of_each_turn = [measured[i][0] for i in range(0, len(measured), 3)]
    assert first_of_each_turn[:4] == ["a", "b", "c", "a"]
    for i in range(0, len(measured), 3):
        turn = measured[i:i + 3]
        assert {c[0] for c in turn} == set(speed)
        assert len({c[1:] for c in turn}) == 1  # the same cell and round on each arm
    for label, cells in out.items():
        assert set(cells) == {"repeat@1", "repeat@8", "open@1", "open@8"}
        cell = cells["open@8"]
        assert cell["tok_s"] == speed[label] + 1  # the median of +0, +1, +2
        assert cell["rounds_tok_s"] == [speed[label], speed[label] + 1, speed[label] + 2]
        assert (cell["drafts"], cell["drafted"], cell["accepted"]) == (3, 12, 6)
