"""Token sampling for one engine step: penalties, filters, seeded draws and logprobs, batched.

The engine calls :meth:`Sampler.sample` once per forward with the logits of every sequence in
the step and one :class:`SamplingRequest` per row; it gets plain Python lists back.

Per row, in this order (the order of transformers' processors, the test oracle):

1. NaN logits become -inf (never chosen).
2. OpenAI ``logit_bias`` is added.
3. Repetition penalty over prompt + output tokens (HF/vLLM), then OpenAI frequency/presence
   penalties over output tokens only: ``logit -= frequency * count + presence * (count > 0)``.
4. Bans become -inf: ``banned_token_ids`` (e.g. EOS while ``min_tokens`` is not reached, bad
   words), every id outside vLLM's ``allowed_token_ids``, every token the row's structured-output
   constraint does not allow (one bitmask for the constrained rows only; unconstrained rows
   pay nothing).
5. Greedy rows (``temperature == 0``): argmax, ties to the lowest id. Filters do not apply.
6. Other rows: divide by temperature, then top-k, top-p, min-p, and draw one token.

Drawing: inverse CDF with one float64 uniform per row, from the row's own generator when it has
one (seeded requests: the same tokens whatever else is batched, and wherever the row sits) or
from the sampler's generator otherwise. This needs one random number per row where the
exponential race needs a vocabulary's worth (about 20x slower on CPU; see BENCHMARKS.md).
Rows with top-k or top-p are filtered and drawn inside a window of their largest logits, never
sorting the vocabulary (see :func:`~hermes_async.model.logits_processors.filtered_probs`).

Logprobs (``params.logprobs``/``top_logprobs``) are vLLM's default: log-softmax of the raw model
logits, before penalties, bans, temperature and filters (NaN counted as -inf). They are -inf for
a token the raw logits rule out, and meaningless (NaN or arbitrary) for a row with +inf or no
finite logits.

Broken rows: a row with no token left to choose (every logit -inf or NaN, everything banned, or
+inf logits that make the distribution undefined) does not affect the other rows; it falls back
to the argmax of its raw logits (NaN as -inf), over the non-banned ids while one of them is above
-inf; token 0 if nothing is.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import NamedTuple

import torch

from hermes_async.model.logits_processors import (
    NEG_INF,
    Group,
    add_logit_bias,
    allow_only,
    apply_bitmasks,
    apply_penalties,
    ban_tokens,
    draw_from_cdf,
    fallback_argmax,
    filtered_probs,
    select_rows,
)
from hermes_async.step import SamplingRequest, min_tokens_ban

__all__ = ["SampleResult", "Sampler", "SamplingRequest", "min_tokens_ban"]


class SampleResult(NamedTuple):
    """The step's choices, one entry per row in request order.

    logprobs: None when no row asked; else the chosen token's raw logprob, None for rows that
        did not ask. top_logprobs: likewise, the row's ``top_logprobs`` best ``(id, logprob)``
        pairs in descending order ([] when it asked for logprobs only).
    """

    token_ids: list[int]
    logprobs: list[float | None] | None
    top_logprobs: list[list[tuple[int, float]] | None] | None


_Part = tuple[list[int], torch.Tensor, torch.Tensor]  # (rows, chosen ids, alive)


class Sampler:
    """Chooses one token per row of a ``[batch, vocab]`` logits tensor. Stateless per step:
    the only state is the shared random stream for rows without their own generator.

    device: where logits arrive and generators live (CPU or CUDA); logits elsewhere are refused.
    seed: seeds the shared stream (default: from ``os.urandom``).
    top_p_candidates: how many largest logits a top-p row (without top-k) examines first; rows
        whose nucleus may be wider are redone with 8x more, so the kept set is the same for
        any value, only the cost changes (64 suits real LM logits; see BENCHMARKS.md).
    """

    def __init__(self, device: str | torch.device = "cpu", seed: int | None = None,
                 top_p_candidates: int = 64) -> None:
        if top_p_candidates < 1:
            raise ValueError("top_p_candidates must be >= 1")
        self.device = torch.device(device)
        self.top_p_candidates = top_p_candidates
        self._generator = self.new_generator(seed)

    def new_generator(self, seed: int | None = None, stream: int = 0) -> torch.Generator:
        """A random stream on the sampler's device for one sequence. The same ``(seed, stream)``
        always gives the same stream; use ``stream`` to give the ``n`` sequences of one seeded
        request different, reproducible streams. ``seed=None``: seeded from ``os.urandom``."""
        if seed is None:
            value = int.from_bytes(os.urandom(8), "little")
        elif stream == 0:
            value = seed % 2**64
        else:
            digest = hashlib.blake2b(f"{seed}:{stream}".encode(), digest_size=8).digest()
            value = int.from_bytes(digest, "little")
        return torch.Generator(device=self.device).manual_seed(value)

    def sample(self, logits: torch.Tensor, requests: Sequence[SamplingRequest]) -> SampleResult:
        """Choose one token per row of ``logits`` ``[len(requests), vocab]`` (any float dtype,
        on the sampler's device; not modified). One device-to-host copy for the ids."""
        raw = self._check(logits, requests)
        if not requests:
            return SampleResult([], None, None)
        parts, groups = self._process(raw, requests)
        for rows, probs, ids in groups:
            columns, alive = draw_from_cdf(probs, self._uniforms([requests[i].generator
                                                                  for i in rows]))
            chosen = columns if ids is None else ids.gather(1, columns[:, None])[:, 0]
            parts.append((rows, chosen, alive))
        tokens, alive = _assemble(parts, len(requests), raw.device)
        token_ids, alive_list = torch.stack([tokens, alive.long()]).tolist()
        for i in (i for i, ok in enumerate(alive_list) if not ok):
            token_ids[i] = fallback_argmax(raw[i], requests[i].banned_token_ids)
        return SampleResult(token_ids, *self._logprobs(raw, requests, token_ids))

    def distribution(self, logits: torch.Tensor,
                     requests: Sequence[SamplingRequest]) -> torch.Tensor:
        """The exact distribution :meth:`sample` draws each row from, ``[batch, vocab]`` float32:
        normalised probabilities for sampled rows, one-hot for greedy and fallback rows.
        Consumes no randomness (for tests and debugging)."""
        raw = self._check(logits, requests)
        out = torch.zeros_like(raw)
        parts, groups = self._process(raw, requests)
        for rows, probs, ids in groups:
            total = probs.sum(dim=-1, keepdim=True)
            index = _index(rows, raw.device)
            norm = probs / total
            if ids is not None:
                norm = torch.zeros(len(rows), raw.shape[-1], device=raw.device).scatter_(
                    1, ids, norm)
            out.index_copy_(0, index, norm)
            alive = (total[:, 0] > 0) & torch.isfinite(total[:, 0])
            parts.append((rows, torch.zeros_like(alive, dtype=torch.long), alive))
        tokens, alive = _assemble(parts, len(requests), raw.device)
        for i, ok in enumerate(alive.tolist()):
            if not ok:
                tokens[i] = fallback_argmax(raw[i], requests[i].banned_token_ids)
        rows = torch.tensor([not r.params.greedy for r in requests], device=raw.device) & alive
        one_hot = torch.zeros_like(out).scatter_(1, tokens[:, None], 1.0)
        return torch.where(rows[:, None], out, one_hot)

    # -- steps ---------------------------------------------------------------------------------

    def _check(self, logits: torch.Tensor, requests: Sequence[SamplingRequest]) -> torch.Tensor:
        if logits.dim() != 2 or logits.shape[0] != len(requests):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(requests)} requests")
        dev = logits.device
        if dev.type != self.device.type or (
                None not in (dev.index, self.device.index) and dev.index != self.device.index):
            raise ValueError(f"logits on {dev}, sampler on {self.device}")
        return (logits if logits.dtype == torch.float32 else logits.float()).contiguous()

    def _process(self, raw: torch.Tensor, requests: Sequence[SamplingRequest],
                 ) -> tuple[list[_Part], list[Group]]:
        """Greedy choices (as parts) and the sampled rows' final probabilities (as groups)."""
        parts: list[_Part] = []
        plain = [i for i, r in enumerate(requests) if r.params.greedy and not _adjusts(r)]
        if plain:  # fast path: one argmax, NaN rows marked dead (max propagates NaN)
            values, ids = select_rows(raw, plain).max(dim=-1)
            parts.append((plain, ids, ~values.isnan()))
        work = [i for i, r in enumerate(requests) if not r.params.greedy or _adjusts(r)]
        if not work:
            return parts, []
        z = select_rows(raw, work)
        z = z.nan_to_num(nan=NEG_INF) if z is raw else z.nan_to_num_(nan=NEG_INF)
        reqs = [requests[i] for i in work]
        ps = [r.params for r in reqs]
        if any(p.logit_bias for p in ps):
            add_logit_bias(z, [p.logit_bias for p in ps])
        apply_penalties(z, [r.prompt_token_ids for r in reqs], [r.output_token_ids for r in reqs],
                        [p.repetition_penalty for p in ps], [p.frequency_penalty for p in ps],
                        [p.presence_penalty for p in ps])
        ban_tokens(z, [r.banned_token_ids for r in reqs])
        if any(p.allowed_token_ids is not None for p in ps):
            allow_only(z, [p.allowed_token_ids for p in ps])
        constrained = [j for j, r in enumerate(reqs) if r.constraint is not None]
        apply_bitmasks(z, constrained, [reqs[j].constraint for j in constrained])
        greedy = [j for j, p in enumerate(ps) if p.greedy]
        if greedy:
            values, ids = select_rows(z, greedy).max(dim=-1)
            parts.append(([work[j] for j in greedy], ids, values > NEG_INF))
        sampled = [j for j, p in enumerate(ps) if not p.greedy]
        if not sampled:
            return parts, []
        zs, sp = select_rows(z, sampled), [ps[j] for j in sampled]
        if any(p.temperature != 1.0 for p in sp):
            zs.div_(torch.tensor([p.temperature for p in sp], device=z.device)[:, None])
        groups = filtered_probs(zs, [p.top_k for p in sp], [p.top_p for p in sp],
                                [p.min_p for p in sp], self.top_p_candidates)
        return parts, [([work[sampled[j]] for j in rows], probs, ids)
                       for rows, probs, ids in groups]

    def skip(self, generator: torch.Generator, draws: int) -> None:
        """Advance a row's own generator by ``draws`` draws, as that many sampled rows would
        (speculative decoding rewinds a stream to the draws of the tokens it kept)."""
        for _ in range(draws):
            torch.rand(1, generator=generator, dtype=torch.float64, device=self.device)

    def _uniforms(self, generators: list[torch.Generator | None]) -> torch.Tensor:
        """One float64 uniform per row; a row's own generator advances by exactly one draw."""
        kw = {"dtype": torch.float64, "device": self.device}
        shared = sum(g is None for g in generators)
        if shared == len(generators):
            return torch.rand(shared, generator=self._generator, **kw)
        pool = iter(torch.rand(shared, generator=self._generator, **kw).split(1) if shared else ())
        return torch.cat([next(pool) if g is None else torch.rand(1, generator=g, **kw)
                          for g in generators])

    def _logprobs(self, raw: torch.Tensor, requests: Sequence[SamplingRequest],
                  token_ids: list[int]) -> tuple[list | None, list | None]:
        rows = [i for i, r in enumerate(requests) if r.params.logprobs]
        if not rows:
            return None, None
        logp = torch.log_softmax(select_rows(raw, rows).nan_to_num(nan=NEG_INF), dim=-1)
        chosen = logp.gather(1, torch.tensor([token_ids[i] for i in rows], device=raw.device)
                             [:, None])[:, 0].tolist()
        k_max = min(max(requests[i].params.top_logprobs for i in rows), raw.shape[-1])
        best_vals, best_ids = (logp.topk(k_max, dim=-1) if k_max else (logp[:, :0], logp[:, :0]))
        best_vals, best_ids = best_vals.tolist(), best_ids.long().tolist()
        logprobs: list[float | None] = [None] * len(requests)
        top: list[list[tuple[int, float]] | None] = [None] * len(requests)
        for j, i in enumerate(rows):
            k = requests[i].params.top_logprobs
            logprobs[i], top[i] = chosen[j], list(zip(best_ids[j][:k], best_vals[j][:k],
                                                      strict=True))
        return logprobs, top


def _adjusts(r: SamplingRequest) -> bool:
    """Whether the row needs the penalty/ban pass (else greedy may take the raw argmax)."""
    p = r.params
    return bool(r.banned_token_ids or r.constraint is not None or p.repetition_penalty != 1.0
                or p.frequency_penalty or p.presence_penalty or p.logit_bias
                or p.allowed_token_ids is not None)


def _assemble(parts: list[_Part], n: int, device: torch.device,
              ) -> tuple[torch.Tensor, torch.Tensor]:
    if len(parts) == 1 and len(parts[0][0]) == n:
        return parts[0][1], parts[0][2]
    tokens = torch.empty(n, dtype=torch.long, device=device)
    alive = torch.empty(n, dtype=torch.bool, device=device)
    for rows, ids, ok in parts:
        index = _index(rows, device)
        tokens.index_copy_(0, index, ids)
        alive.index_copy_(0, index, ok)
    return tokens, alive


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device)
