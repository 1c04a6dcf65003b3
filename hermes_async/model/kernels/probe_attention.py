"""The attention probe: a backend's code path on the model's shapes against float64 attention.

Runs in the probe's child process (:mod:`.child`). The backend is made as the runner makes it
(``Class(block_size, num_heads, num_kv_heads, head_dim, dtype, sliding_windows, path=...)``) and
its plans go through a script of steps that covers what a server sends: a prefill from
nothing over several blocks, a prefill chunk after cached blocks shared with another sequence
(a fork in the prefix tree) beside a fresh prefill, a decode batch, a mixed step (decodes,
a chunk across a block boundary, a new prefill), and a long context decoded alone (the split
decodes of a step with too few work items). Block ids are shuffled. Each step writes random
K/V through the backend's own write and attends; the outputs are compared with attention
computed in float64 from the same (dtype-rounded) inputs, per sliding window the model has.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from hermes_async.model.kernels.paths import ProbeReport, resolve
from hermes_async.model.kernels.shapes import ProbeShapes
from hermes_async.model.kv_pool import KVPool, KVPoolShape
from hermes_async.model.loader import DTYPES
from hermes_async.model.slots import positions_and_slots
from hermes_async.step import SequenceStep

# largest |kernel - float64| allowed, relative to max(1, |reference|): the output's rounding and
# a low-precision P.V product (bf16 keeps 8 bits), far below what a wrong kernel gives (~1)
TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2, "float16": 2e-3}


@dataclass
class _Sequence:
    table: list[int]
    k: list[torch.Tensor] = field(default_factory=list)  # float64 [kv_heads, d] per position
    v: list[torch.Tensor] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.k)


def reference_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                        start: int, scale: float, window: int | None) -> torch.Tensor:
    """float64 causal attention of queries at positions ``start..`` ``[n, heads, d]`` over
    ``keys``/``values`` ``[ctx, kv_heads, d]``; grouped heads; ``window`` as transformers
    applies it (a query at p sees keys at positions > p - window)."""
    n, heads, _ = q.shape
    group = heads // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, ctx, d]
    v = values.repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.einsum("nhd,hcd->hnc", q, k) * scale
    q_pos = torch.arange(start, start + n)[:, None]
    k_pos = torch.arange(keys.shape[0])[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hnc,hcd->nhd", scores.softmax(-1), v)


class _Script:
    """The sequences of the probe and the block ids they take."""

    def __init__(self, block_size: int, num_blocks: int, seed: int) -> None:
        self.block_size = block_size
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.seqs: dict[str, _Sequence] = {}

    def blocks_for(self, seq: _Sequence, length: int) -> None:
        while len(seq.table) * self.block_size < length:
            seq.table.append(self.free.pop())

    def steps(self) -> list[list[tuple[str, int]]]:
        """Each step: (sequence, new tokens); ``C`` forks ``A`` after its first two blocks."""
        bs = self.block_size
        return [[("A", 2 * bs + 3)],
                [("C", 5), ("B", 7)],
                [("A", 1), ("B", 1), ("C", 1)],
                [("A", 1), ("B", bs + 1), ("C", 1), ("D", 3)],
                [("E", 5 * bs + 1)],
                [("E", 1)]]


def _run_script(backend: object, shapes: ProbeShapes, window: int | None,
                seed: int) -> tuple[float, float, int]:
    """Largest error, largest reference magnitude, tokens checked."""
    dtype = DTYPES[shapes.dtype]
    bs, kvh, heads, d = shapes.block_size, shapes.num_kv_heads, shapes.num_heads, shapes.head_dim
    script = _Script(bs, num_blocks=24, seed=seed)
    pool = KVPool(KVPoolShape(1, 24, bs, kvh, d, dtype), torch.device("cpu"),
                  backend.kv_layout)  # type: ignore[attr-defined]
    gen = torch.Generator().manual_seed(seed)
    scale = d ** -0.5
    worst, magnitude, checked = 0.0, 0.0, 0
    for step_spec in script.steps():
        steps, seqs = [], []
        for name, n in step_spec:
            seq = script.seqs.get(name)
            if seq is None:
                if name == "C":  # a fork: A's first two blocks, then its own
                    a = script.seqs["A"]
                    seq = _Sequence(a.table[:2], a.k[:2 * bs], a.v[:2 * bs])
                else:
                    seq = _Sequence([])
                script.seqs[name] = seq
            script.blocks_for(seq, seq.length + n)
            steps.append(SequenceStep(tuple(seq.table), seq.length, (0,) * n))
            seqs.append(seq)
        ordering = backend.order(steps)  # type: ignore[attr-defined]
        packed = [steps[i] for i in ordering.indices]
        packed_seqs = [seqs[i] for i in ordering.indices]
        _, slots = positions_and_slots(packed, bs)
        t = sum(s.num_new_tokens for s in packed)
        q = torch.randn(t, heads, d, generator=gen).to(dtype)
        k = torch.randn(t, kvh, d, generator=gen).to(dtype)
        v = torch.randn(t, kvh, d, generator=gen).to(dtype)
        plan = backend.plan(packed, slots, ordering)  # type: ignore[attr-defined]
        out = plan.attend(pool.blocks(0), q, k, v, scale, window).double()
        row = 0
        for s, seq in zip(packed, packed_seqs, strict=True):
            n = s.num_new_tokens
            seq.k.extend(k[row:row + n].double().unbind(0))
            seq.v.extend(v[row:row + n].double().unbind(0))
            ref = reference_attention(q[row:row + n].double(), torch.stack(seq.k),
                                      torch.stack(seq.v), s.start_pos, scale, window)
            worst = max(worst, float((out[row:row + n] - ref).abs().max()))
            magnitude = max(magnitude, float(ref.abs().max()))
            row += n
            checked += n
    return worst, magnitude, checked


def probe_backend(shapes: ProbeShapes, backend: str, path: str = "") -> ProbeReport:
    """``backend`` (``"module:Class"``) on its code path ``path`` against float64 attention."""
    cls = resolve(backend)
    extra = {"path": path} if path else {}
    made = cls(shapes.block_size, shapes.num_heads, shapes.num_kv_heads, shapes.head_dim,
               DTYPES[shapes.dtype], shapes.windows, **extra)
    worst, magnitude, checked = 0.0, 0.0, 0
    for i, window in enumerate(shapes.windows):
        err, mag, n = _run_script(made, shapes, window, seed=1234 + i)
        worst, magnitude, checked = max(worst, err), max(magnitude, mag), checked + n
    tolerance = TOLERANCE[shapes.dtype] * max(1.0, magnitude)
    return ProbeReport(worst, tolerance, f"{checked} query tokens in 6 steps")
