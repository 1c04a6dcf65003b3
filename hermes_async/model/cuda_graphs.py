"""CUDA graphs for decode-only steps (the ``flashinfer`` backend on CUDA; ``model.cuda_graphs``).
Experimental: written without a GPU; ``tests/model/test_cuda_backend.py`` checks replay
against eager decoding wherever a CUDA device and flashinfer are present.

At start-up (:func:`maybe_capture`, from :class:`~hermes_async.model.runner.ModelRunner`) the
model's forward over a decode batch is captured once per batch-size bucket
(:data:`BATCH_BUCKETS`) into a CUDA graph that reads static device buffers (token ids,
positions, pool slots) and a fixed-size FlashInfer decode plan
(:class:`~hermes_async.model.attention.flashinfer_cuda.GraphDecodePlan`). A decode-only step of
``n`` sequences (``n`` up to the largest bucket) then fills the first ``n`` rows of the buffers
(one host-to-device copy), pads the bucket's other rows (token 0 at position 0, written to and
reading only a scratch block kept out of the engine's pool), re-plans the bucket's wrappers on
the host, and replays: one launch for the whole forward instead of several kernels per layer.
Prefill chunks, mixed steps and larger batches run eagerly, as without graphs.

The scratch block is the pool's last; :attr:`ModelRunner.num_blocks` leaves it out while graphs
are on. A capture that fails is logged and leaves every step eager.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hermes_async.step import SequenceStep

if TYPE_CHECKING:
    from hermes_async.model.attention.flashinfer_cuda import FlashInferBackend, GraphDecodePlan
    from hermes_async.model.kv_pool import KVPool
    from hermes_async.model.llama import LlamaModel
    from hermes_async.model.runner import ModelRunner

log = logging.getLogger("hermes_async.model")

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # 64: the scheduler's default max_num_seqs


class DecodeGraphs:
    """One captured decode forward per batch-size bucket, over shared static buffers.

    ``capture=False`` runs the same padded static-buffer path eagerly, without graphs (the CPU
    tests of the padding use it; it also helps to tell a graph problem from a plan problem).
    """

    def __init__(self, model: LlamaModel, pool: KVPool, backend: FlashInferBackend,
                 max_model_len: int, scratch_block: int,
                 buckets: Sequence[int] = BATCH_BUCKETS, capture: bool = True) -> None:
        self.model, self.pool, self.backend = model, pool, backend
        self.buckets = tuple(sorted(set(buckets)))
        self.scratch_block = scratch_block
        self.scratch_slot = scratch_block * pool.block_size
        self.capture = capture
        self.replays = 0  # decode steps served from the buckets (tests and logs read it)
        dev, largest = pool.device, self.buckets[-1]
        # rows: token ids, positions, slots; row r's first b entries feed bucket b
        self.inputs = torch.zeros(3, largest, dtype=torch.long, device=dev)
        self.inputs[2].fill_(self.scratch_slot)
        self.logits_indices = torch.arange(largest, dtype=torch.long, device=dev)
        max_pages = -(-max_model_len // pool.block_size)
        self._entries: dict[int, tuple[torch.cuda.CUDAGraph | None, GraphDecodePlan,
                                       torch.Tensor]] = {}
        mempool = torch.cuda.graph_pool_handle() if capture else None
        for b in reversed(self.buckets):  # largest first: the smaller graphs reuse its memory
            plan = backend.graph_plan(b, max_pages, self.inputs[2, :b])
            plan.update([], scratch_block)  # all rows padding: capture touches the scratch only
            out = self._forward(b, plan)  # warm-up: lazy initialisation outside the capture
            graph = None
            if capture:
                torch.cuda.synchronize(dev)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=mempool):
                    out = self._forward(b, plan)
            self._entries[b] = (graph, plan, out)
        if capture:
            torch.cuda.synchronize(dev)

    def _forward(self, b: int, plan: GraphDecodePlan) -> torch.Tensor:
        return self.model(self.inputs[0, :b], self.inputs[1, :b], plan, self.pool,
                          self.logits_indices[:b])

    def bucket_for(self, n: int) -> int | None:
        """The smallest bucket that holds ``n`` decodes, or None (eager)."""
        return next((b for b in self.buckets if b >= n), None)

    def can_run(self, packed: Sequence[SequenceStep]) -> bool:
        return len(packed) <= self.buckets[-1] and all(s.is_decode for s in packed)

    def run(self, packed: Sequence[SequenceStep], input_ids: Sequence[int],
            positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Logits ``[n, vocab]`` of a decode-only step (``positions``/``slots`` on the host, in
        ``packed`` order), from its bucket's graph. The result is a view of the graph's output
        buffer: valid until the next replay, so callers copy it (the runner's reorder does)."""
        n = len(packed)
        b = self.bucket_for(n)
        if b is None or not self.can_run(packed):
            raise ValueError(f"not a decode batch of at most {self.buckets[-1]}: {n} steps")
        graph, plan, out = self._entries[b]
        host = torch.empty(3, b, dtype=torch.long)
        host[0, :n] = torch.tensor(list(input_ids), dtype=torch.long)
        host[1, :n] = positions
        host[2, :n] = slots
        host[:2, n:] = 0
        host[2, n:] = self.scratch_slot
        self.inputs[:, :b].copy_(host)
        plan.update(packed, self.scratch_block)
        if graph is None:
            out = self._forward(b, plan)
        else:
            graph.replay()
        self.replays += 1
        return out[:n]


def maybe_capture(runner: ModelRunner) -> DecodeGraphs | None:
    """The runner's decode graphs when ``model.cuda_graphs`` is on and the backend is
    ``flashinfer`` on CUDA, else None; logs what it did and why (called on CUDA only)."""
    if not runner.model_config.cuda_graphs:
        log.info("cuda graphs: off (model.cuda_graphs = false)")
        return None
    if runner.attention.name != "flashinfer":
        log.info("cuda graphs: off (they need the flashinfer backend, not %s)",
                 runner.attention.name)
        return None
    t0 = time.perf_counter()
    try:
        graphs = DecodeGraphs(runner.model, runner.pool, runner.attention,  # type: ignore[arg-type]
                              runner.max_model_len, scratch_block=runner.pool.num_blocks - 1)
    except Exception:  # a capture that fails must not stop the server: eager still works
        log.warning("cuda graphs: capture failed; every step runs eagerly", exc_info=True)
        return None
    log.info("cuda graphs: decode batches %s captured in %.1f s (scratch block %d)",
             ", ".join(map(str, graphs.buckets)), time.perf_counter() - t0,
             graphs.scratch_block)
    return graphs
