"""The engine's :class:`~hermes_async.step.StepRunner` over the model: one packed forward of
:class:`ModelRunner`, then the batched :class:`Sampler` on the steps that carry a
:class:`~hermes_async.step.SamplingRequest`. Runs in the engine's worker thread; nothing here
touches engine state.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from hermes_async.model.kv_blocks import PoolBlockIO, kv_fingerprint
from hermes_async.model.runner import ModelRunner
from hermes_async.model.sampler import Sampler
from hermes_async.step import SampledToken, SamplingRequest, SequenceStep, accepted_samples


class StepExecutor:
    """Forward + sampling for the engine; exposes the pool's block size and count."""

    def __init__(self, runner: ModelRunner, sampler: Sampler | None = None) -> None:
        self.model_runner = runner
        self.sampler = sampler or Sampler(device=runner.device)
        self.block_size = runner.block_size
        self.num_blocks = runner.num_blocks
        self.max_model_len = runner.max_model_len

    @functools.cached_property
    def kv_blocks(self) -> PoolBlockIO:
        """Whole-block copies for the prefix cache's disk tier (the fingerprint is computed
        on first use: it reads a little of each weight file)."""
        r = self.model_runner
        mc = r.model_config
        fingerprint = kv_fingerprint(r.model_dir, dtype=r.dtype_name,
                                     quantization=mc.quantization, activations=mc.activations,
                                     attention=type(r.attention).__name__, pool=r.pool)
        return PoolBlockIO(r.pool, fingerprint)

    def new_generator(self, seed: int, stream: int) -> torch.Generator:
        return self.sampler.new_generator(seed, stream=stream)

    @torch.inference_mode()
    def execute(self, steps: Sequence[SequenceStep]) -> list[SampledToken | None]:
        """The forward, then every sampled position in one batch: a step's last token, and for
        a step with drafts each drafted position too, verified by :func:`accepted_samples`."""
        logits = self.model_runner.forward(steps)
        rows: list[int] = []  # the logits row of each sampled position
        requests: list[SamplingRequest] = []
        row = 0
        for s in steps:
            if s.sampling is not None:
                rows.extend(range(row, row + s.num_sampled))
                requests.append(s.sampling)
                requests.extend(s.draft_sampling)
            row += 1 + s.num_drafts
        out: list[SampledToken | None] = [None] * len(steps)
        if not rows:
            return out
        # a seeded sequence's stream, drawn once per drafted position, is rewound to the
        # draws of the tokens it keeps: its output is then the same as without drafts
        streams = {i: (s.sampling.generator, s.sampling.generator.get_state())
                   for i, s in enumerate(steps)
                   if s.num_drafts and s.sampling is not None and s.sampling.params.temperature
                   and isinstance(s.sampling.generator, torch.Generator)}
        index = torch.tensor(rows, dtype=torch.long, device=logits.device)
        result = self.sampler.sample(logits.index_select(0, index), requests)
        j = 0
        for i, s in enumerate(steps):
            if s.sampling is None:
                continue
            samples = []
            for r in range(j, j + s.num_sampled):
                logprob = result.logprobs[r] if result.logprobs is not None else None
                top = (tuple(result.top_logprobs[r] or ()) if result.top_logprobs is not None
                       else ())
                samples.append(SampledToken(result.token_ids[r], logprob, top))
            j += s.num_sampled
            drafts = s.token_ids[len(s.token_ids) - s.num_drafts:]
            out[i] = token = accepted_samples(drafts, samples) if s.num_drafts else samples[0]
            if i in streams and len(token.following) < s.num_drafts:
                generator, state = streams[i]
                generator.set_state(state)
                self.sampler.skip(generator, 1 + len(token.following))
        return out
