"""The engine's side of structured outputs and bad words, over the fake runner: each sequence
gets its own constraint, fed every sampled token; a complete grammar ends the sequence with
``stop`` (its last token streamed); a rejected token ends it with an error; nothing leaks."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from hermes_async.engine.core import bad_words_ban
from hermes_async.engine.request import GRAMMAR_REJECTED
from hermes_async.types import (
    FinishReason,
    GuideKind,
    InvalidParameter,
    SamplingParams,
    StructuredOutput,
)
from tests.engine.fake_runner import reference_tokens
from tests.engine.test_engine_fake import assert_idle, collect, greedy, make_engine

SPEC = StructuredOutput(GuideKind.REGEX, "fake")


@dataclass
class CountingConstraint:
    """Accepts ``limit`` tokens then is finished; rejects tokens in ``reject``."""

    limit: int
    reject: frozenset[int] = frozenset()
    vocab_size: int = 1000
    seen: list[int] = field(default_factory=list)

    def fill_bitmask(self, row) -> None:
        row[:] = -1

    def accept(self, token_id: int) -> bool:
        if token_id in self.reject:
            return False
        self.seen.append(token_id)
        return True

    @property
    def is_finished(self) -> bool:
        return len(self.seen) >= self.limit

    @property
    def error(self) -> str | None:
        return "rejected"


@dataclass
class FakeCompiled:
    limit: int
    reject: frozenset[int] = frozenset()
    made: list[CountingConstraint] = field(default_factory=list)

    def new_constraint(self) -> CountingConstraint:
        self.made.append(CountingConstraint(self.limit, self.reject))
        return self.made[-1]


def test_bad_words_ban_rule() -> None:
    words = ((7,), (3, 4), (1, 2, 5))
    assert bad_words_ban(words, []) == {7}
    assert bad_words_ban(words, [9, 3]) == {7, 4}
    assert bad_words_ban(words, [1, 2]) == {7, 5}
    assert bad_words_ban(words, [2, 1]) == {7}


async def test_complete_grammar_stops_each_sequence_with_its_last_token() -> None:
    async with make_engine() as engine:
        compiled = FakeCompiled(limit=5)
        prompt = list(range(10, 30))
        params = SamplingParams(max_tokens=50, temperature=0.0, n=2, structured=SPEC)
        req = engine.add_request(prompt, params, grammar=compiled)
        outs = []
        while not (outs and outs[-1].usage is not None):
            outs.append(await req.queue.get())
        assert len(compiled.made) == 2 and compiled.made[0] is not compiled.made[1]
        for i in (0, 1):
            mine = [o for o in outs if o.index == i]
            ids = [t for o in mine for t in o.token_ids]
            assert ids == reference_tokens(prompt, 5) == compiled.made[i].seen
            assert mine[-1].finish_reason is FinishReason.STOP
        assert_idle(engine)


async def test_rejected_token_ends_with_an_error_and_releases_everything() -> None:
    async with make_engine() as engine:
        prompt = list(range(40, 60))
        bad = reference_tokens(prompt, 3)[2]
        compiled = FakeCompiled(limit=100, reject=frozenset({bad}))
        params = SamplingParams(max_tokens=20, temperature=0.0, structured=SPEC)
        req = engine.add_request(prompt, params, grammar=compiled)
        outs = []
        while not (outs and outs[-1].finish_reason is not None):
            outs.append(await req.queue.get())
        assert outs[-1].finish_reason is FinishReason.ERROR
        assert "grammar rejected token" in outs[-1].error
        assert outs[-1].error_code == GRAMMAR_REJECTED  # the request's doing: a 400
        assert [t for o in outs for t in o.token_ids] == reference_tokens(prompt, 2)
        assert_idle(engine)


async def test_structured_without_its_grammar_is_refused() -> None:
    async with make_engine() as engine:
        with pytest.raises(InvalidParameter):
            engine.add_request([1, 2, 3], SamplingParams(structured=SPEC))
        with pytest.raises(InvalidParameter) as e:  # no grammar compiler in these parts
            await engine.compile_grammar(SPEC)
        assert e.value.code == "unsupported_parameter"
        ids, _, _ = await collect(engine, [5, 6, 7], greedy(3))
        assert ids == reference_tokens([5, 6, 7], 3)
