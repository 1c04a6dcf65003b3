"""The step protocol: one forward pass as the scheduler plans it and the runner executes it.

Plain data (stdlib only): the engine imports it to describe steps, ``hermes_async.model``
imports it to execute them; neither imports the other. One :class:`SequenceStep` per sequence
flows unchanged from the scheduler to the runner and its sampler; its :attr:`SequenceStep.kind`
is the one place that decides whether a step is a decode. A :class:`StepRunner` turns a list
of them into one packed forward and returns a :class:`SampledToken` for each step that carries
a :class:`SamplingRequest`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from hermes_async.types import SamplingParams


class StepKind(StrEnum):
    """How a sequence's share of a step is computed.

    ``decode``: exactly one new token attending to its cached context (the batched single-query
    attention path): a generated token, or a prompt's last token after a full prefix-cache hit.
    ``prefill``: a chunk of several prompt tokens (causal attention over the chunk, after the
    cached prefix).
    """

    DECODE = "decode"
    PREFILL = "prefill"


class TokenConstraint(Protocol):
    """A sequence's structured-output state (``hermes_async.grammar.GrammarConstraint``).

    The sampler calls :meth:`fill_bitmask` before choosing the row's token (in the runner's
    thread); the engine calls ``accept`` with the chosen token after the step.
    """

    vocab_size: int

    def fill_bitmask(self, row: Any) -> None:
        """Write the allowed next tokens into ``row`` (a C-contiguous numpy int32 array of
        ``ceil(vocab_size / 32)`` words: token ``t`` is allowed iff bit ``t % 32`` of word
        ``t // 32`` is set)."""
        ...


@dataclass(frozen=True, slots=True)
class SamplingRequest:
    """Sampling inputs of one step whose last new token's logits are to be sampled.

    prompt_token_ids: the prompt (for the repetition penalty only; may be left empty otherwise).
    output_token_ids: the tokens generated so far (repetition, frequency and presence penalties).
    generator: the sequence's own random stream from :meth:`StepRunner.new_generator`, advanced
        in place by each non-greedy step; opaque to the engine, which keeps it with the sequence
        for its whole life (also across preemption). ``None`` draws from the runner's shared
        stream (not reproducible).
    banned_token_ids: ids that must not be chosen this step (see :func:`min_tokens_ban`; bad
        words).
    constraint: the sequence's grammar state when its output is constrained: only the tokens
        it allows may be chosen.
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    generator: object | None = None
    banned_token_ids: frozenset[int] = frozenset()
    constraint: TokenConstraint | None = None


def min_tokens_ban(params: SamplingParams, num_output_tokens: int,
                   eos_token_ids: Iterable[int]) -> frozenset[int]:
    """The one ``min_tokens`` rule: while a sequence has fewer than ``min_tokens`` output
    tokens, its ``stop_token_ids`` and (unless ``ignore_eos``) the EOS ids are banned, as vLLM
    does."""
    if num_output_tokens >= params.min_tokens:
        return frozenset()
    return frozenset(params.stop_token_ids).union(() if params.ignore_eos else eos_token_ids)


@dataclass(frozen=True, slots=True)
class SequenceStep:
    """One sequence's share of a forward step.

    block_table: physical KV block ids of the sequence, in token order, covering at least
        ``start_pos + len(token_ids)`` tokens (the prefix tree's blocks first, then private ones).
    start_pos: position of the first new token: the matched (cached) length for a prefill, the
        index of the last token for a decode. K/V of positions ``< start_pos`` must already be in
        the pool at those blocks.
    token_ids: the new tokens to compute; their K/V are written into the pool by this step.
    sampling: set when this step reaches the sequence's last token: its logits are sampled.
    draft_sampling: speculative decoding: the last ``len(draft_sampling)`` of ``token_ids``
        are drafted tokens, not yet verified; the logits after each are sampled too, draft
        ``i``'s with ``draft_sampling[i]`` (``sampling`` samples the position before the
        first draft). The runner keeps the samples while each equals the draft it follows
        (:func:`accepted_samples`). Needs ``sampling``.
    """

    block_table: tuple[int, ...]
    start_pos: int
    token_ids: tuple[int, ...]
    sampling: SamplingRequest | None = None
    draft_sampling: tuple[SamplingRequest, ...] = ()

    @property
    def is_decode(self) -> bool:
        """The one decode rule: exactly one new token (see :class:`StepKind`)."""
        return len(self.token_ids) == 1

    @property
    def kind(self) -> StepKind:
        return StepKind.DECODE if self.is_decode else StepKind.PREFILL

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_drafts(self) -> int:
        return len(self.draft_sampling)

    @property
    def num_sampled(self) -> int:
        """Positions whose logits this step samples: 0, or 1 plus the drafts."""
        return 0 if self.sampling is None else 1 + self.num_drafts

    @property
    def context_len(self) -> int:
        """Tokens attended by the last new token (cached prefix plus new tokens)."""
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True, slots=True)
class SampledToken:
    """The token chosen for one step, with its logprob and top alternatives when asked.

    following: after a step with drafts, the tokens verification kept after this one, in
    order (each the target's own sample at its position; see :func:`accepted_samples`).
    """

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    following: tuple[SampledToken, ...] = ()

    @property
    def tokens(self) -> tuple[SampledToken, ...]:
        """This token and the ones verification kept after it."""
        return (self, *self.following)


def accepted_samples(drafts: Sequence[int], samples: Sequence[SampledToken]) -> SampledToken:
    """The one acceptance rule of speculative decoding: ``samples[0]`` is the target's sample
    at the position before the first draft, ``samples[i]`` the one after draft ``i - 1``
    (``len(samples) == len(drafts) + 1``). Sample ``i`` is kept while every earlier sample
    equals the draft that follows it: the kept tokens are exactly what sampling one token per
    step would have produced with these draws, so greedy output is unchanged and sampled
    output keeps its distribution (the drafts do not depend on the draws)."""
    if len(samples) != len(drafts) + 1:
        raise ValueError(f"{len(samples)} samples for {len(drafts)} drafts")
    kept = 1
    while kept < len(samples) and samples[kept - 1].token_id == drafts[kept - 1]:
        kept += 1
    first = samples[0]
    return SampledToken(first.token_id, first.logprob, first.top_logprobs,
                        tuple(samples[1:kept]))


class StepRunner(Protocol):
    """Executes one packed forward step and samples the steps that ask for it."""

    block_size: int
    num_blocks: int
    max_model_len: int

    def new_generator(self, seed: int, stream: int) -> object:
        """The random stream of a seeded sequence (``stream`` tells the ``n`` sequences of one
        request apart); opaque to the engine."""
        ...

    def execute(self, steps: Sequence[SequenceStep]) -> list[SampledToken | None]:
        """Run ``steps`` as one forward; return a token for each step with ``sampling``.

        Blocking: the engine calls it in its worker thread. Raising fails that step's
        requests only.
        """
        ...


class KVBlockIO(Protocol):
    """Whole KV blocks copied out of and into a runner's pool (the prefix cache's disk tier).

    ``block_bytes``: the bytes of one block (every layer, K and V); ``fingerprint``: names
    everything that makes a block's bytes mean the same KV (weights, dtype, quantization,
    block size, KV layout and shape): blocks are only ever read back under the same one.
    ``read_blocks`` copies blocks out (a read of the pool: safe beside a forward that does not
    write them); ``write_blocks`` copies payloads into blocks no sequence uses yet. Both may run
    in any thread.
    """

    block_bytes: int
    fingerprint: str

    def read_blocks(self, block_ids: Sequence[int]) -> list[bytes]:
        ...

    def write_blocks(self, block_ids: Sequence[int], payloads: Sequence[bytes | memoryview]
                     ) -> None:
        ...
