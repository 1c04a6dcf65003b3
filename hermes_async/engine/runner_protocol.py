"""What the engine needs of a model runner: the contract between engine/ and model/.

The engine never imports torch; it hands the runner plain step descriptions and sampling rows
and gets plain token ids back. ``hermes_async.model.executor.StepExecutor`` implements it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hermes_async.types import SamplingParams, SequenceStep


@dataclass(frozen=True)
class SampleRow:
    """Sampling inputs of one sequence whose last new token's logits are to be sampled."""

    params: SamplingParams
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    sampler_state: Any
    banned_token_ids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


class StepRunner(Protocol):
    """Executes one packed forward step and samples the rows that asked for it."""

    block_size: int
    num_blocks: int
    max_model_len: int

    def new_sampler_state(self, seed: int, stream: int) -> Any:
        """Sampling state of a seeded sequence (its random generator; ``stream`` tells the
        ``n`` sequences of one request apart); opaque to the engine."""
        ...

    def execute(self, steps: Sequence[SequenceStep],
                rows: Sequence[SampleRow | None]) -> list[SampledToken | None]:
        """Run ``steps`` as one forward; return a token for each row that is not None.

        Blocking: the engine calls it in its worker thread. Raising fails that step's
        requests only.
        """
        ...
