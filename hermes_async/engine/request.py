"""Request and sequence state owned by the engine loop, and what it streams back.

A request (one ``generate`` call) has ``n`` sequences; each sequence is what the scheduler
schedules and what the KV cache manager holds blocks for (under ``seq_id``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from hermes_async.cache.pins import Pin
from hermes_async.engine.ngram import NgramIndex
from hermes_async.engine.output_text import OutputText
from hermes_async.step import TokenConstraint
from hermes_async.types import FinishReason, SamplingParams


class SequenceConstraint(TokenConstraint, Protocol):
    """A sequence's grammar state as the engine drives it (``hermes_async.grammar``)."""

    def accept(self, token_id: int) -> bool:
        """Advance by the sampled token; False when the grammar rejects it."""
        ...

    @property
    def is_finished(self) -> bool:
        """The grammar is complete: nothing but EOS may follow."""
        ...

    @property
    def error(self) -> str | None: ...

    # speculative decoding (drafts for a constrained sequence)
    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many of ``token_ids`` the grammar allows in order from here (no state change)."""
        ...

    def forced_tokens(self) -> list[int]:
        """The tokens the grammar forces from here."""
        ...

    def ahead(self, token_ids: tuple[int, ...]) -> TokenConstraint:
        """The mask of the position after ``token_ids`` (allowed, not accepted)."""
        ...


class CompiledConstraint(Protocol):
    """A compiled structured-output grammar (``hermes_async.grammar.CompiledGrammar``)."""

    def new_constraint(self) -> SequenceConstraint: ...


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class Usage:
    """Token counts as OpenAI reports them; ``cached_tokens`` is the prefix-cache hit."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    draft_tokens: int = 0  # speculative decoding: drafted tokens verified (all sequences)
    accepted_draft_tokens: int = 0  # of those, kept in the output

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

GRAMMAR_REJECTED = "grammar_rejected"  # RequestOutput.error_code: a client error (400)


@dataclass(frozen=True)
class RequestOutput:
    """One increment of one sequence of a request.

    ``text`` and ``token_ids`` are new since the previous output of the same ``index``.
    ``finish_reason`` is set on a sequence's last output; ``usage`` on the request's very last
    output (all sequences finished), ``error`` when the request failed (``error_code``:
    ``grammar_rejected`` when the request's own constraints contradicted its grammar, a client
    error; None for a failure of the engine).
    """

    request_id: str
    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    error: str | None = None
    error_code: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(eq=False)
class Sequence:
    """One generated continuation; ``tokens`` = prompt ids followed by output ids."""

    seq_id: str
    request: EngineRequest
    index: int
    tokens: list[int]
    num_prompt_tokens: int
    output_text: OutputText  # detokenizer + stop strings
    generator: object | None  # the runner's random stream of a seeded sequence (opaque)
    constraint: SequenceConstraint | None = None  # structured output: its grammar state
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed: int = 0  # tokens whose KV is in the pool
    admit_order: int = -1  # set on each admission; larger = more recent
    cached_tokens: int | None = None  # matched length at first admission
    disk_tokens: int = 0  # of those, loaded back from the disk tier for it
    finish_reason: FinishReason | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    ngram: NgramIndex | None = None  # speculative decoding: its tokens' n-grams (drafts)
    # speculative decoding: what proposed its latest draft (a KeptChance key; None: forced)
    draft_key: int | None = None
    draft_tokens: int = 0  # drafted tokens verified for it
    accepted_tokens: int = 0  # of those, kept

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.tokens) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        """Out of the scheduler: never scheduled again, its blocks released. Its last output
        may still be waiting for the step's emit (see :attr:`is_done`)."""
        return self.status is SequenceStatus.FINISHED

    @property
    def is_done(self) -> bool:
        """Its last output (the one with ``finish_reason``) is queued."""
        return self.finish_reason is not None


@dataclass(eq=False)
class EngineRequest:
    """A ``generate`` call: its prompt, parameters, sequences and output queue."""

    request_id: str
    namespace: str
    prompt_ids: list[int]
    params: SamplingParams
    queue: asyncio.Queue[RequestOutput]
    arrival_time: float = field(default_factory=time.monotonic)
    sequences: list[Sequence] = field(default_factory=list)
    error: str | None = None
    pin_ttl_s: float | None = None  # a warm-up request: pin its cached prompt on finish
    pin: Pin | None = None  # the operator pin it got, if any
    pin_error: str | None = None  # why pinning was refused (the pin cap)
    grammar: CompiledConstraint | None = None  # params.structured, compiled
    bad_words_ids: tuple[tuple[int, ...], ...] = ()  # params.bad_words, tokenized
    served_by: str | None = None  # the replica that runs it (behind Ray Serve), else None

    @property
    def finished(self) -> bool:
        """Every sequence's last output is queued (the last of them carries the usage)."""
        return all(s.is_done for s in self.sequences)

    def usage(self) -> Usage:
        cached = (self.sequences[0].cached_tokens or 0) if self.sequences else 0
        return Usage(len(self.prompt_ids), sum(s.num_output_tokens for s in self.sequences),
                     cached, sum(s.draft_tokens for s in self.sequences),
                     sum(s.accepted_tokens for s in self.sequences))
