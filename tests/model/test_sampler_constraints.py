"""``logit_bias``, ``allowed_token_ids`` and structured-output bitmasks in the batched sampler,
against transformers' processors where one exists (``SequenceBiasLogitsProcessor`` for single
tokens) and against a direct per-row mask otherwise; rows without them are unaffected."""

from __future__ import annotations

import numpy as np
import torch
from transformers.generation.logits_process import SequenceBiasLogitsProcessor

from hermes_async.model.sampler import Sampler, SamplingRequest
from hermes_async.types import SamplingParams

VOCAB = 100


class SetConstraint:
    """A TokenConstraint allowing a fixed set of ids (the bitmask protocol of ``step``)."""

    def __init__(self, allowed: set[int], vocab_size: int = VOCAB) -> None:
        self.allowed, self.vocab_size = allowed, vocab_size

    def fill_bitmask(self, row: np.ndarray) -> None:
        bits = np.zeros(row.size * 32, dtype=np.uint8)
        bits[sorted(self.allowed)] = 1
        row[:] = np.packbits(bits, bitorder="little").view(np.int32)


def test_logit_bias_matches_sequence_bias_processor() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB)
    bias = ((5, 3.5), (17, -100.0), (99, 12.0))
    params = SamplingParams(temperature=0.7, logit_bias=bias)
    oracle = SequenceBiasLogitsProcessor({(t,): b for t, b in bias})(
        torch.zeros(3, 1, dtype=torch.long), logits.clone())
    got = Sampler().distribution(logits, [SamplingRequest(params)] * 3)
    want = torch.softmax(oracle / 0.7, dim=-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    greedy = Sampler().sample(logits, [SamplingRequest(SamplingParams(
        temperature=0, logit_bias=((42, 100.0),)))] * 3)
    assert greedy.token_ids == [42, 42, 42]


def test_allowed_token_ids_and_bitmask_leave_other_rows_alone() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, VOCAB)
    allowed = {3, 50, 77}
    reqs = [SamplingRequest(SamplingParams(temperature=1.0)),
            SamplingRequest(SamplingParams(temperature=1.0, allowed_token_ids=(3, 50, 77))),
            SamplingRequest(SamplingParams(temperature=1.0), constraint=SetConstraint(allowed)),
            SamplingRequest(SamplingParams(temperature=0.0), constraint=SetConstraint({64, 65}))]
    dist = Sampler().distribution(logits, reqs)
    torch.testing.assert_close(dist[0], torch.softmax(logits[0], -1))
    for row in (1, 2):
        masked = torch.full((VOCAB,), float("-inf"))
        masked[sorted(allowed)] = logits[row, sorted(allowed)]
        torch.testing.assert_close(dist[row], torch.softmax(masked, -1))
    assert int(dist[3].argmax()) == max((64, 65), key=lambda t: float(logits[3, t]))
    for seed in range(20):
        out = Sampler(seed=seed).sample(logits, reqs).token_ids
        assert out[1] in allowed and out[2] in allowed and out[3] in (64, 65)


def test_constraint_narrower_than_the_logits_bans_the_rest() -> None:
    logits = torch.zeros(1, 70)
    logits[0, 69] = 10.0  # outside the constraint's 64-token vocabulary
    c = SetConstraint({1, 2}, vocab_size=64)
    out = Sampler().sample(logits, [SamplingRequest(SamplingParams(temperature=0),
                                                    constraint=c)])
    assert out.token_ids[0] in (1, 2)
