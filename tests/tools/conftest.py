"""Shared helpers of the tool-call tests: the default model's tokenizer (skipped when absent),
and collecting a stream's events."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hermes_async.tools import ArgumentsDelta, ContentDelta, ToolCallStart, ToolCallStream

SMOL_DIR = Path(os.path.expanduser("~/.cache/hermes_async/models/SmolLM2-135M-Instruct"))


@pytest.fixture(scope="session")
def hf_tokenizer() -> Any:
    """The default model's Hugging Face tokenizer (the test skips when it is not downloaded)."""
    if not (SMOL_DIR / "tokenizer.json").exists():
        pytest.skip(f"no tokenizer at {SMOL_DIR}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(SMOL_DIR))


@dataclass
class Streamed:
    """What a stream's events add up to."""

    content: str = ""
    starts: list[ToolCallStart] = field(default_factory=list)
    args: dict[int, str] = field(default_factory=dict)
    events: list[Any] = field(default_factory=list)

    @property
    def calls(self) -> list[tuple[str, str]]:
        return [(s.name, self.args.get(s.index, "")) for s in self.starts]


def run_stream(stream: ToolCallStream, pieces: list[str]) -> Streamed:
    """Feed ``pieces`` then finish; check the events' own invariants; sum them up."""
    out = Streamed()
    for piece in pieces:
        out.events += stream.feed(piece)
    out.events += stream.finish()
    for ev in out.events:
        if isinstance(ev, ContentDelta):
            assert ev.text
            out.content += ev.text
        elif isinstance(ev, ToolCallStart):
            assert ev.index == len(out.starts), "calls are numbered 0, 1, ... in order"
            assert ev.name
            out.starts.append(ev)
        else:
            assert isinstance(ev, ArgumentsDelta)
            assert ev.text
            assert 0 <= ev.index < len(out.starts), "arguments come after their call's start"
            out.args[ev.index] = out.args.get(ev.index, "") + ev.text
    ids = [s.id for s in out.starts]
    assert len(set(ids)) == len(ids), "the stream's ids are distinct"
    return out
