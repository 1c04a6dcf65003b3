"""The step scheduler: which sequences compute which tokens in the next forward pass.

Synchronous and torch-free; owned by the engine loop. Each ``schedule()`` packs, under a token
budget and a sequence cap:

1. every running decode (one token each, oldest admission first): decodes are never starved;
2. the next chunk of every running prefill that is not finished (long prompts are chunked);
3. new admissions from the waiting queue, each starting at its matched (cached) length; one
   whose prompt continues on the disk tier waits (skipped, not blocking others) until those
   blocks are loaded back, then starts past them.

When the KV pool cannot hold a running sequence's next token even after eviction, the most
recently admitted sequence is preempted: its blocks are released (its committed blocks stay in
the prefix tree, so re-admission usually hits them) and it goes back to the front of the queue.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hermes_async.cache.manager import KVCacheManager
from hermes_async.config import SchedulerConfig
from hermes_async.engine.request import Sequence, SequenceStatus
from hermes_async.step import SamplingRequest, SequenceStep


@dataclass
class ScheduledBatch:
    """One step's plan: ``steps[i]`` is what ``seqs[i]`` computes (the runner's input as is)."""

    steps: list[SequenceStep] = field(default_factory=list)
    seqs: list[Sequence] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_preempted: int = 0
    first_admissions: list[Sequence] = field(default_factory=list)  # their first admission

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


SamplingFor = Callable[[Sequence, tuple[int, ...]], SamplingRequest]
"""The sampling inputs of a sequence whose step reaches its last token, as if the given drafted
tokens followed it (``()``: none; from the engine core)."""

Proposer = Callable[[Sequence, int], tuple[int, ...]]
"""Speculative decoding: the tokens proposed to follow a decoding sequence (``()``: none),
given how many sequences decode in the step."""


@dataclass(frozen=True)
class Drafting:
    """When decodes carry drafts: ``propose`` for each, while at most ``max_batch_seqs``
    sequences decode."""

    propose: Proposer
    max_batch_seqs: int


class Scheduler:
    """Waiting queue, running set and the per-step packing over a :class:`KVCacheManager`."""

    def __init__(self, config: SchedulerConfig, cache: KVCacheManager,
                 sampling_for: SamplingFor, clock: Callable[[], float] = time.monotonic,
                 drafting: Drafting | None = None) -> None:
        self.config = config
        self.cache = cache
        self.sampling_for = sampling_for
        self.clock = clock
        self.drafting = drafting
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._admissions = 0
        self.num_preemptions = 0

    # ----- queue --------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is (finish, abort, error); releases its blocks once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.cache.release(seq.seq_id)
        elif seq.status is SequenceStatus.WAITING:
            with contextlib.suppress(ValueError):
                self.waiting.remove(seq)
            self.cache.forget(seq.seq_id)
        seq.status = SequenceStatus.FINISHED

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def num_waiting_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.waiting)

    # ----- one step -----------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """Pick this step's work; the returned block tables are valid until the next call."""
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        chosen: dict[int, tuple[Sequence, SequenceStep]] = {}
        decodes = [s for s in self.running if len(s.tokens) - s.num_computed == 1]
        prefills = [s for s in self.running if len(s.tokens) - s.num_computed > 1]
        drafting = self.drafting
        if drafting is not None and len(decodes) > drafting.max_batch_seqs:
            drafting = None  # under load drafts cost more than they save
        for seq in sorted(decodes, key=lambda s: s.admit_order) + prefills:
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted while making room for an older one
            if budget <= 0 or len(chosen) >= self.config.max_num_seqs:
                break
            left = len(seq.tokens) - seq.num_computed
            n = min(left, budget)
            drafts: tuple[int, ...] = ()
            if drafting is not None and left == 1:  # not a prefill the budget cut to one token
                # a decode's drafts, within the budget left after one token for each other decode
                room = budget - (len(decodes) - len(chosen))
                drafts = drafting.propose(seq, len(decodes))[:max(0, room)]
                if drafts and self.cache.grow(seq.seq_id, seq.num_computed + n + len(drafts)) \
                        is None:
                    drafts = ()  # drafts never preempt anyone
            if not self._make_room(seq, seq.num_computed + n + len(drafts), chosen, batch):
                continue
            chosen[id(seq)] = self._entry(seq, n, drafts)
            budget -= n + len(drafts)
        if not batch.num_preempted:
            budget = self._admit(budget, chosen, batch.first_admissions)
        for seq, step in chosen.values():
            if step.is_decode or step.num_drafts:  # a decode and its drafts
                batch.num_decode_tokens += step.num_new_tokens
            else:
                batch.num_prefill_tokens += step.num_new_tokens
            batch.seqs.append(seq)
            batch.steps.append(step)
        return batch

    def update_from_output(self, batch: ScheduledBatch,
                           sampled: list[tuple[int, ...] | None]) -> list[int]:
        """Record a finished step: advance computed lengths, cache newly full blocks, append
        each step's new tokens (one, or after drafts the ones verification kept). Returns the
        batch indices that got new tokens (still running).

        A step with drafts computed K/V for all of them, but only the drafts that were kept
        count as computed: the length rolls back to them, so the next step overwrites the
        slots of the others, and only blocks of verified tokens ever enter the prefix tree.
        Steps whose sequence left the running set during the step (aborted) are skipped.
        """
        grown = []
        bs = self.cache.block_size
        for i, (seq, step, tokens) in enumerate(zip(batch.seqs, batch.steps, sampled,
                                                    strict=True)):
            if seq.status is not SequenceStatus.RUNNING:
                continue
            kept = len(tokens) - 1 if tokens and step.num_drafts else 0
            seq.num_computed = step.context_len - step.num_drafts + kept
            if tokens:
                seq.tokens.extend(tokens)
                grown.append(i)
            if seq.num_computed // bs > step.start_pos // bs:  # a block filled up: cache it
                self.cache.commit(seq.seq_id, seq.tokens[:seq.num_computed])
        return grown

    def pop_unfittable(self) -> Sequence | None:
        """When nothing runs and the head of the queue still cannot be admitted, the pool is
        too small for it: take it out so the caller can fail it (else it would wait forever)."""
        if self.running or not self.waiting or self.cache.num_loading:
            return None
        return self.waiting.popleft()

    def _entry(self, seq: Sequence, n: int,
               drafts: tuple[int, ...] = ()) -> tuple[Sequence, SequenceStep]:
        start = seq.num_computed
        completes = start + n == len(seq.tokens)  # reaches the last token: sample its logits
        step = SequenceStep(tuple(self.cache.block_table(seq.seq_id)), start,
                            (*seq.tokens[start:start + n], *drafts),
                            self.sampling_for(seq, ()) if completes else None,
                            tuple(self.sampling_for(seq, drafts[:j + 1])
                                  for j in range(len(drafts))))
        return seq, step

    def _make_room(self, seq: Sequence, num_tokens: int,
                   chosen: dict[int, tuple[Sequence, SequenceStep]],
                   batch: ScheduledBatch) -> bool:
        """Grow ``seq``'s blocks to ``num_tokens``, preempting newer sequences as needed.
        False when ``seq`` itself had to be preempted."""
        while self.cache.grow(seq.seq_id, num_tokens) is None:
            victim = max(self.running, key=lambda s: s.admit_order)
            chosen.pop(id(victim), None)
            self._preempt(victim)
            batch.num_preempted += 1
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.cache.release(seq.seq_id)
        seq.status = SequenceStatus.WAITING
        seq.num_computed = 0
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _admit(self, budget: int, chosen: dict[int, tuple[Sequence, SequenceStep]],
               first: list[Sequence]) -> int:
        skipped: list[Sequence] = []
        while self.waiting and budget > 0 and len(chosen) < self.config.max_num_seqs:
            seq = self._next_waiting()
            loaded = self.cache.prepare(seq.seq_id, seq.request.namespace, seq.tokens) \
                if self._ready(seq) else None
            if loaded is None:
                skipped.append(seq)  # siblings wait for the first; a prompt's blocks load
                continue
            admission = self.cache.admit(seq.seq_id, seq.request.namespace, seq.tokens,
                                         num_new_tokens=budget)
            if admission is None:
                self.waiting.appendleft(seq)
                break
            self._admissions += 1
            seq.admit_order = self._admissions
            seq.status = SequenceStatus.RUNNING
            seq.num_computed = admission.matched_len
            if seq.cached_tokens is None:
                seq.cached_tokens = admission.matched_len
                seq.disk_tokens = min(loaded, admission.matched_len)
                first.append(seq)
            self.running.append(seq)
            n = min(len(seq.tokens) - seq.num_computed, budget)
            chosen[id(seq)] = self._entry(seq, n)
            budget -= n
        self.waiting.extendleft(reversed(skipped))
        return budget

    def _next_waiting(self) -> Sequence:
        """Pop the next sequence to admit under the configured policy."""
        if self.config.policy == "fcfs" or len(self.waiting) == 1:
            return self.waiting.popleft()
        now = self.clock()
        head = self.waiting[0]
        if now - head.request.arrival_time >= self.config.max_wait_s:
            return self.waiting.popleft()  # bounded wait: the oldest goes first
        window = list(self.waiting)[:64]
        best = max(window, key=lambda s: (self.cache.probe(s.request.namespace, s.tokens),
                                          -s.request.arrival_time))
        self.waiting.remove(best)
        return best

    @staticmethod
    def _ready(seq: Sequence) -> bool:
        """Sibling sequences (n > 1) wait until the first one's prompt is computed, so they
        find the prompt's blocks in the prefix tree instead of computing them again."""
        if seq.index == 0 or seq.num_computed:
            return True
        first = seq.request.sequences[0]
        return first.is_finished or first.num_computed >= first.num_prompt_tokens
