"""A torch-free StepRunner whose "KV cache" is the token ids themselves.

It keeps a slot -> token map like the real pool; each step it rebuilds every sequence's context
from its block table (cached prefix) plus the new tokens, and the next token is a hash of that
whole context. Any bookkeeping error (a block freed while still in use, a wrong table, a bad
duplicate swap) changes the context it reads and therefore the tokens, which the tests compare
with :func:`reference_tokens`, computed from the true context.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

from hermes_async.step import SampledToken, SequenceStep

VOCAB = 1000
EOS = 2


def next_token(context: Sequence[int]) -> int:
    digest = hashlib.blake2b(repr(tuple(context)).encode(), digest_size=8).digest()
    return 3 + int.from_bytes(digest, "little") % (VOCAB - 3)


def reference_tokens(prompt: Sequence[int], n: int) -> list[int]:
    ctx, out = list(prompt), []
    for _ in range(n):
        tok = next_token(ctx)
        out.append(tok)
        ctx.append(tok)
    return out


class StepFailure(RuntimeError):
    pass


@dataclass
class FakeRunner:
    block_size: int = 4
    num_blocks: int = 256
    max_model_len: int = 512
    fail_rate: float = 0.0
    seed: int = 0
    fail_every: int = 0  # deterministic: fail steps fail_every//2, that + fail_every, ...

    def __post_init__(self) -> None:
        self.slots: dict[int, int] = {}
        self.rng = random.Random(self.seed)
        self.steps = 0
        self.failures = 0

    def new_generator(self, seed: int, stream: int) -> None:
        return None

    def execute(self, steps: Sequence[SequenceStep]) -> list[SampledToken | None]:
        self.steps += 1
        scheduled = self.fail_every and self.steps % self.fail_every == self.fail_every // 2
        if scheduled or (self.fail_rate and self.rng.random() < self.fail_rate):
            self.failures += 1
            raise StepFailure("injected runner failure")
        bs = self.block_size
        out: list[SampledToken | None] = []
        for step in steps:
            row = step.sampling
            assert step.context_len <= len(step.block_table) * bs
            ctx = []
            for pos in range(step.start_pos):
                slot = step.block_table[pos // bs] * bs + pos % bs
                ctx.append(self.slots.get(slot, -1))
            for pos, tok in enumerate(step.token_ids, start=step.start_pos):
                self.slots[step.block_table[pos // bs] * bs + pos % bs] = tok
            ctx.extend(step.token_ids)
            if row is None:
                out.append(None)
                continue
            tok = next_token(ctx)
            if tok in row.banned_token_ids:
                tok = 3
            out.append(SampledToken(tok))
        return out


class FakeDelta:
    def __init__(self, text: str, stopped: bool) -> None:
        self.text, self.stopped = text, stopped


class FakeOutputText:
    """Token ``t`` reads as ``"<t>"``; stop strings are honoured on that text."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops, self.text, self.done = stops, "", False

    def append(self, token: int) -> FakeDelta:
        piece = f"<{token}>"
        full = self.text + piece
        for s in self.stops:
            i = full.find(s)
            if i >= 0:
                emitted, self.text = full[len(self.text):i], full[:i]
                return FakeDelta(emitted, True)
        self.text = full
        return FakeDelta(piece, False)

    def finish(self) -> FakeDelta:
        return FakeDelta("", False)


def fake_output_text(prompt_ids: list[int], stops: tuple[str, ...]) -> FakeOutputText:
    return FakeOutputText(stops)
