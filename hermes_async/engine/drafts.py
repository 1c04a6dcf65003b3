"""Speculative decoding's drafting side: what to propose for a decoding sequence, how many
tokens of it are worth verifying, and the figures of how well it went.

:class:`Drafter` is the engine core's one entry (torch-free, on the event loop):

- **Proposals** (``speculative.method``): ``ngram``, the sequence's own context
  (:class:`~hermes_async.engine.ngram.NgramIndex`); ``suffix``, that and the namespace's tree of
  earlier answers (:class:`~hermes_async.engine.suffix.AnswerTrees`), the tree's draft where
  its match is longer. A constrained sequence drafts what its grammar forces, else the
  proposal, cut at the first token its grammar rejects.
- **Length**: a drafted token costs compute whether or not it is kept. With ``r`` the
  sequence's chance that a drafted token is kept once the one before it was (a running
  estimate over its verified drafts: the kept tokens over the kept ones plus the first
  rejected one; the tokens after a rejection were never tested, so counting them as failures,
  as a plain share of the drafted tokens does, would take a copying sequence's long drafts
  for short ones) draft ``i`` is kept
  with chance about ``r ** i``; it is worth verifying while that chance is above the step's
  marginal cost of one token relative to one sequence's share of a step,
  ``b / (a / S + b)`` for ``S`` decoding sequences and a step time ``a + b * tokens``
  (:class:`StepCost`, fitted on the engine's own steps). At batch 1 on a weight-bound forward
  nearly any draft pays; under load only sequences that keep copying do.
- **Figures**: drafts, drafted and accepted tokens, per request and for ``/cache/stats``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hermes_async.config import SpeculativeConfig
from hermes_async.engine.ngram import NgramIndex
from hermes_async.engine.request import Sequence
from hermes_async.engine.suffix import AnswerTrees

PRIOR_ACCEPTANCE = 0.5  # a sequence's continuation chance before its first verified draft
ACCEPTANCE_WEIGHT = 0.3  # the running estimate's weight of the newest draft
RECOVERY = 0.05  # per step without drafts, the estimate's move back towards the prior
MIN_CHANCE = 0.02  # never draft a token kept less often than this, whatever the cost model


class StepCost:
    """A forward's time as ``a + b * tokens``: least squares over the recent steps
    (exponentially weighted, ``decay`` per step). Until the steps vary enough in size to tell
    ``a`` from ``b``, ``b`` is taken as ``a / prior_tokens`` (a step of ``prior_tokens``
    tokens costs twice a step of one)."""

    def __init__(self, decay: float = 0.98, prior_tokens: float = 16.0) -> None:
        self.decay, self.prior_tokens = decay, prior_tokens
        self._w = self._n = self._t = self._nn = self._nt = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        d = self.decay
        self._w = self._w * d + 1.0
        self._n = self._n * d + tokens
        self._t = self._t * d + seconds
        self._nn = self._nn * d + tokens * tokens
        self._nt = self._nt * d + tokens * seconds

    def fit(self) -> tuple[float, float] | None:
        """``(a, b)``, or None before any step."""
        if self._w == 0.0:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var = self._nn / self._w - mean_n * mean_n
        if var > 1.0:
            b = (self._nt / self._w - mean_n * mean_t) / var
            a = mean_t - b * mean_n
            if a > 0.0 and b > 0.0:
                return a, b
        a = mean_t / (1.0 + mean_n / self.prior_tokens)
        return a, a / self.prior_tokens

    def break_even(self, decodes: int) -> float:
        """The chance of being kept above which one more drafted token pays, with ``decodes``
        sequences decoding."""
        fitted = self.fit()
        if fitted is None:
            return MIN_CHANCE
        a, b = fitted
        return max(MIN_CHANCE, b / (a / max(decodes, 1) + b))


@dataclass
class DraftFigures:
    """Counts since start (vLLM's meanings): drafts (steps with drafted tokens), drafted
    tokens, accepted tokens (drafted tokens kept; the target's own token not counted)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def as_dict(self) -> dict[str, float]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens,
                "accepted_tokens": self.accepted_tokens,
                "acceptance_rate": (self.accepted_tokens / self.draft_tokens
                                    if self.draft_tokens else 0.0),
                "mean_accepted_length": (self.accepted_tokens / self.drafts
                                         if self.drafts else 0.0)}


class Drafter:
    """Proposals, their lengths and the figures for one engine (see the module docstring)."""

    def __init__(self, spec: SpeculativeConfig) -> None:
        self.spec = spec
        self.cost = StepCost()
        self.figures = DraftFigures()
        self.trees = (AnswerTrees(int(spec.tree_max_mib * 2**20), spec.tree_depth,
                                  spec.tree_max_answers, spec.min_probability)
                      if spec.method == "suffix" else None)

    def propose(self, seq: Sequence, most: int, decodes: int) -> tuple[int, ...]:
        """Up to ``most`` tokens to follow ``seq``'s last one, as many as pay with ``decodes``
        sequences decoding."""
        spec = self.spec
        rate = seq.draft_acceptance if seq.draft_acceptance is not None else PRIOR_ACCEPTANCE
        threshold = self.cost.break_even(decodes)
        worth, chance = 0, rate
        while worth < most and chance >= threshold:
            worth, chance = worth + 1, chance * rate
        if not spec.adaptive:
            worth = most
        if worth == 0:  # drift back towards the prior: a sequence may start copying later
            if seq.draft_acceptance is not None:
                seq.draft_acceptance += RECOVERY * (PRIOR_ACCEPTANCE - seq.draft_acceptance)
            return ()
        constraint = seq.constraint
        drafts = tuple(constraint.forced_tokens()[:worth]) if constraint is not None else ()
        if not drafts:
            if seq.ngram is None:
                seq.ngram = NgramIndex(spec.min_n, spec.max_n)
            drafts, matched = seq.ngram.match(seq.tokens, worth)
            tree = self.trees.get(seq.request.namespace) if self.trees is not None else None
            if tree is not None:
                found = tree.propose(seq.tokens, worth, spec.min_n)
                if found is not None and found.matched > matched:
                    drafts = found.tokens
        if constraint is not None and drafts:
            drafts = drafts[:constraint.valid_prefix(list(drafts))]
        return drafts

    def verified(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """A step verified ``drafted`` tokens of ``seq`` and kept ``accepted`` of them."""
        tested = accepted + (1 if accepted < drafted else 0)  # the kept ones, the first miss
        share = accepted / tested
        old = seq.draft_acceptance
        seq.draft_acceptance = share if old is None else (
            old + ACCEPTANCE_WEIGHT * (share - old))
        seq.draft_tokens += drafted
        seq.accepted_tokens += accepted
        f = self.figures
        f.drafts += 1
        f.draft_tokens += drafted
        f.accepted_tokens += accepted

    def answered(self, seq: Sequence) -> None:
        """``seq`` finished: its answer joins its namespace's tree (method ``suffix``)."""
        if self.trees is not None and seq.num_output_tokens:
            self.trees.add(seq.request.namespace, seq.output_ids)

    def forget(self, namespace: str | None) -> None:
        """Drop one namespace's answers (None: every namespace's)."""
        if self.trees is not None:
            self.trees.drop(namespace)

    def stats(self) -> dict[str, object]:
        out: dict[str, object] = {"method": self.spec.method, **self.figures.as_dict()}
        fitted = self.cost.fit()
        if fitted is not None:
            out["step_cost_ms"] = {"per_step": fitted[0] * 1e3, "per_token": fitted[1] * 1e3}
        if self.trees is not None:
            out["answer_trees"] = self.trees.stats()
        return out
