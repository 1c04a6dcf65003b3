"""Speculative decoding's drafting side: what to propose for a decoding sequence, how many
tokens of it are worth verifying, and the figures of how well it went.

:class:`Drafter` is the engine core's one entry (torch-free, on the event loop):

- **Proposals** (``speculative.method``): ``ngram``, the sequence's own context
  (:class:`~hermes_async.engine.ngram.NgramIndex`); ``suffix``, that and the namespace's tree of
  earlier answers (:class:`~hermes_async.engine.suffix.AnswerTrees`), the tree's draft where
  its match is longer. A constrained sequence drafts what its grammar forces, else the
  proposal, cut at the first token its grammar rejects.
- **Length**: a drafted token costs compute whether or not it is kept. With ``r`` the chance
  that a drafted token is kept once the one before it was, draft ``i`` is kept with chance
  about ``r ** i``; it is worth verifying while that chance is above the step's marginal cost
  of one token relative to one sequence's share of a step, ``b / (a / S + b)`` for ``S``
  decoding sequences and a step time ``a + b * tokens`` (:class:`StepCost`, fitted on the
  engine's steps of decodes and drafts only). ``r`` comes from :class:`KeptChance`:
  engine-wide counts by where the draft came from and how long a tail it matched, which is
  what tells a copy (a long match: nearly every token kept) from a coincidence (a short
  match) better than any one sequence's history. At batch 1 on a weight-bound forward nearly
  any draft pays; under load only long matches do. Tokens a grammar forces are always kept:
  they are drafted whole.
- **Figures**: drafts, drafted and accepted tokens, per request and for ``/cache/stats``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hermes_async.config import SpeculativeConfig
from hermes_async.engine.ngram import NgramIndex
from hermes_async.engine.request import Sequence
from hermes_async.engine.suffix import AnswerTrees

MIN_CHANCE = 0.02  # never draft a token kept less often than this, whatever the cost model
MATCH_BUCKETS = 16  # matched tails of 1..16 tokens counted apart (longer ones with 16)
PRIOR_KEPT, PRIOR_TESTED = 1.0, 2.0  # each bucket's counts before any verification: 0.5
DECAY = 0.99  # per verification, the weight its bucket's older counts keep
RECOVERY = 0.02  # per draft withheld, its bucket's move back towards the prior


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


class KeptChance:
    """The chance that a drafted token is kept once the one before it was, by the draft's
    source (the sequence's own context, or the namespace's answer tree) and the length of the
    tail it matched: exponentially decayed counts of the tokens verifications tested (the kept
    ones and the first miss; those after a miss were never tested), over every sequence of
    the engine. A bucket whose drafts stop paying is not verified any more, so each withheld
    draft moves it back towards the prior a little (it is tried again later)."""

    def __init__(self) -> None:
        self._kept = [PRIOR_KEPT] * (2 * MATCH_BUCKETS)
        self._tested = [PRIOR_TESTED] * (2 * MATCH_BUCKETS)

    @staticmethod
    def key(from_tree: bool, matched: int) -> int:
        return (MATCH_BUCKETS if from_tree else 0) + min(max(matched, 1), MATCH_BUCKETS) - 1

    def chance(self, key: int) -> float:
        return self._kept[key] / self._tested[key]

    def observe(self, key: int, kept: int, tested: int) -> None:
        self._kept[key] = self._kept[key] * DECAY + kept
        self._tested[key] = self._tested[key] * DECAY + tested

    def withheld(self, key: int) -> None:
        self._kept[key] += RECOVERY * (PRIOR_KEPT - self._kept[key])
        self._tested[key] += RECOVERY * (PRIOR_TESTED - self._tested[key])

    def as_dict(self) -> dict[str, list[float]]:
        """Per source, the chance for tails of 1..MATCH_BUCKETS tokens."""
        rates = [round(self.chance(key), 3) for key in range(2 * MATCH_BUCKETS)]
        return {"context": rates[:MATCH_BUCKETS], "tree": rates[MATCH_BUCKETS:]}


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
        self.kept = KeptChance()
        self.figures = DraftFigures()
        self.trees = (AnswerTrees(int(spec.tree_max_mib * 2**20), spec.tree_depth,
                                  spec.tree_max_answers, spec.min_probability)
                      if spec.method == "suffix" else None)

    def propose(self, seq: Sequence, most: int, decodes: int) -> tuple[int, ...]:
        """Up to ``most`` tokens to follow ``seq``'s last one, as many as pay with ``decodes``
        sequences decoding."""
        constraint = seq.constraint
        forced = tuple(constraint.forced_tokens()[:most]) if constraint is not None else ()
        if forced:  # kept whatever the sampler: always worth it
            seq.draft_key = None
            return forced
        spec = self.spec
        if seq.ngram is None:
            seq.ngram = NgramIndex(spec.min_n, spec.max_n)
        drafts, matched = seq.ngram.match(seq.tokens, most)
        key = self.kept.key(False, matched)
        tree = self.trees.get(seq.request.namespace) if self.trees is not None else None
        if tree is not None:
            found = tree.propose(seq.tokens, most, spec.min_n)
            if found is not None and found.matched > matched:
                drafts, key = found.tokens, self.kept.key(True, found.matched)
        if not drafts:
            return ()
        if spec.adaptive:
            rate, threshold = self.kept.chance(key), self.cost.break_even(decodes)
            worth, chance = 0, rate
            while worth < len(drafts) and chance >= threshold:
                worth, chance = worth + 1, chance * rate
            if worth == 0:
                self.kept.withheld(key)
                return ()
            drafts = drafts[:worth]
        if constraint is not None:
            drafts = drafts[:constraint.valid_prefix(list(drafts))]
        seq.draft_key = key
        return drafts

    def verified(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """A step verified ``drafted`` tokens of ``seq`` and kept ``accepted`` of them."""
        if seq.draft_key is not None:
            tested = accepted + (1 if accepted < drafted else 0)  # the kept ones, the first miss
            self.kept.observe(seq.draft_key, accepted, tested)
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
        out: dict[str, object] = {"method": self.spec.method, **self.figures.as_dict(),
                                  "kept_chance_by_match": self.kept.as_dict()}
        fitted = self.cost.fit()
        if fitted is not None:
            out["step_cost_ms"] = {"per_step": fitted[0] * 1e3, "per_token": fitted[1] * 1e3}
        if self.trees is not None:
            out["answer_trees"] = self.trees.stats()
        return out
