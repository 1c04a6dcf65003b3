"""The engine's :class:`~hermes_async.step.StepRunner` over the model: one packed forward of
:class:`ModelRunner`, then the batched :class:`Sampler` on the steps that carry a
:class:`~hermes_async.step.SamplingRequest`. Runs in the engine's worker thread; nothing here
touches engine state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hermes_async.model.runner import ModelRunner
from hermes_async.model.sampler import Sampler
from hermes_async.step import SampledToken, SamplingRequest, SequenceStep


class StepExecutor:
    """Forward + sampling for the engine; exposes the pool's block size and count."""

    def __init__(self, runner: ModelRunner, sampler: Sampler | None = None) -> None:
        self.model_runner = runner
        self.sampler = sampler or Sampler(device=runner.device)
        self.block_size = runner.block_size
        self.num_blocks = runner.num_blocks
        self.max_model_len = runner.max_model_len

    def new_generator(self, seed: int, stream: int) -> torch.Generator:
        return self.sampler.new_generator(seed, stream=stream)

    @torch.inference_mode()
    def execute(self, steps: Sequence[SequenceStep]) -> list[SampledToken | None]:
        logits = self.model_runner.forward(steps)
        wanted = [i for i, s in enumerate(steps) if s.sampling is not None]
        out: list[SampledToken | None] = [None] * len(steps)
        if not wanted:
            return out
        requests: list[SamplingRequest] = [steps[i].sampling for i in wanted]  # type: ignore[misc]
        index = torch.tensor(wanted, dtype=torch.long, device=logits.device)
        result = self.sampler.sample(logits.index_select(0, index), requests)
        for j, i in enumerate(wanted):
            logprob = result.logprobs[j] if result.logprobs is not None else None
            top = tuple(result.top_logprobs[j] or ()) if result.top_logprobs is not None else ()
            out[i] = SampledToken(result.token_ids[j], logprob, top)
        return out
