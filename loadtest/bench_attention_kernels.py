"""Attention kernels per layer: each backend's ``attend`` (new K/V written into the pool, then
attention), same inputs, same run; prints a markdown table.

    python loadtest/bench_attention_kernels.py                         # vllm-cpu, native-cpu
    python loadtest/bench_attention_kernels.py --backends torch vllm-cpu native-cpu --threads 2
    python loadtest/bench_attention_kernels.py --context 150 --cold-mb 64    # as in a model

Cases (SmolLM2-135M's attention shapes by default: 9 query heads, 3 KV heads, head_dim 64):
``decode`` (``--seqs`` sequences, one new token each after ``--context`` cached tokens) and
``prefill`` (``--new`` tokens of one sequence after ``--cached`` cached ones). Blocks are
shuffled through the pool as the prefix cache leaves them; the backends take turns call by
call. The max |difference| column is against a float32 computation of the same attention.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Callable

import torch
from timing import sample_seconds

from hermes_async.model.attention.base import AttentionBackend
from hermes_async.step import SequenceStep

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make_backend(name: str, a: argparse.Namespace, dtype: torch.dtype) -> AttentionBackend:
    if name == "torch":
        from hermes_async.model.attention.reference import TorchBackend

        return TorchBackend(a.block_size, torch.device("cpu"))
    if name == "vllm-cpu":
        from hermes_async.model.attention.vllm_cpu import VllmCpuBackend as cls
    elif name == "native-cpu":
        from hermes_async.model.attention.native import build
        from hermes_async.model.attention.native_cpu import NativeCpuBackend as cls

        build()  # a no-op once built (make setup builds it)
    else:
        raise SystemExit(f"unknown backend {name}")
    return cls(a.block_size, a.heads, a.kv_heads, a.head_dim, dtype, [None])


def make_case(kind: str, a: argparse.Namespace) -> tuple[list[SequenceStep], int]:
    """The step and the number of pool blocks it needs (block ids shuffled)."""
    bs = a.block_size
    lens = [(a.context, 1)] * a.seqs if kind == "decode" else [(a.cached, a.new)]
    total = sum(-(-(c + n) // bs) for c, n in lens)
    ids = list(range(total))
    random.Random(0).shuffle(ids)
    steps = []
    for cached, new in lens:
        need = -(-(cached + new) // bs)
        steps.append(SequenceStep(tuple(ids[:need]), cached, (7,) * new))
        ids = ids[need:]
    return steps, total


def slots_of(steps: list[SequenceStep], bs: int) -> torch.Tensor:
    out = []
    for s in steps:
        out += [s.block_table[p // bs] * bs + p % bs for p in range(s.start_pos, s.context_len)]
    return torch.tensor(out, dtype=torch.long)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, steps: list[SequenceStep],
              scale: float) -> torch.Tensor:
    """Float32 attention of the step; ``k``/``v``: every sequence's whole context, in order."""
    outs, q0, k0 = [], 0, 0
    for s in steps:
        n, ctx = s.num_new_tokens, s.context_len
        ks, vs = (t[k0:k0 + ctx].float().transpose(0, 1) for t in (k, v))
        qs = q[q0:q0 + n].float().transpose(0, 1)
        mask = torch.arange(ctx)[None] <= torch.arange(s.start_pos, ctx)[:, None]
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True).transpose(0, 1))
        q0, k0 = q0 + n, k0 + ctx
    return torch.cat(outs)


def split(t: torch.Tensor, steps: list[SequenceStep]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's cached rows and its new rows of ``t`` (whole contexts, in order)."""
    cached, new, k0 = [], [], 0
    for s in steps:
        cached.append(t[k0:k0 + s.start_pos])
        new.append(t[k0 + s.start_pos:k0 + s.context_len])
        k0 += s.context_len
    return torch.cat(cached), torch.cat(new)


def prepare(name: str, kind: str, a: argparse.Namespace,
            dtype: torch.dtype) -> tuple[Callable[[], object], float]:
    """One backend on one case: (the timed call, its max |difference| from float32). The
    cached context is written by the backend itself first (vllm-cpu packs K its own way)."""
    backend = make_backend(name, a, dtype)
    steps, num_blocks = make_case(kind, a)
    assert backend.order(steps).indices == list(range(len(steps))), "packed as given"
    gen = torch.Generator().manual_seed(1)
    shape = (num_blocks, a.block_size, a.kv_heads, a.head_dim)
    if backend.kv_layout == "hnd":
        shape = (num_blocks, a.kv_heads, a.block_size, a.head_dim)
    pool = (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
    ctx = sum(s.context_len for s in steps)
    k, v = (torch.randn(ctx, a.kv_heads, a.head_dim, generator=gen).to(dtype) for _ in "kv")
    scale = a.head_dim ** -0.5
    with torch.inference_mode():
        fill = [SequenceStep(s.block_table, 0, (7,) * s.start_pos) for s in steps]
        (k_old, k_new), (v_old, v_new) = split(k, steps), split(v, steps)
        q_fill = torch.zeros(len(k_old), a.heads, a.head_dim, dtype=dtype)
        fill_plan = backend.plan(fill, slots_of(fill, a.block_size), backend.order(fill))
        fill_plan.attend(pool, q_fill, k_old, v_old, scale, None)
        q = torch.randn(len(k_new), a.heads, a.head_dim, generator=gen).to(dtype)
        plan = backend.plan(steps, slots_of(steps, a.block_size), backend.order(steps))
        out = plan.attend(pool, q, k_new, v_new, scale, None)
        diff = (out.float() - reference(q, k, v, steps, scale)).abs().max()

    def call() -> object:
        with torch.inference_mode():
            return plan.attend(pool, q, k_new, v_new, scale, None)

    return call, float(diff)


def blocks_copy(kind: str, a: argparse.Namespace, dtype: torch.dtype) -> Callable[[], object]:
    """The memory floor of a case: copy every K/V block its step reads (the whole context of
    each sequence, ``hnd`` blocks) into a preallocated buffer, nothing computed."""
    steps, num_blocks = make_case(kind, a)
    shape = (num_blocks, a.kv_heads, a.block_size, a.head_dim)
    k, v = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    ids = torch.tensor([b for s in steps for b in s.block_table[: -(-s.context_len //
                                                                     a.block_size)]])
    k_out, v_out = k[ids], v[ids]  # (advanced indexing copies)

    def call() -> object:
        torch.index_select(k, 0, ids, out=k_out)
        return torch.index_select(v, 0, ids, out=v_out)

    return call


def evictor(megabytes: int) -> Callable[[], object] | None:
    """A call that reads ``megabytes`` of other memory (untimed, before each measured call):
    the pool then comes from DRAM, as a layer's K/V does after the other layers' weights."""
    if megabytes <= 0:
        return None
    other = torch.ones(megabytes << 18, dtype=torch.float32)  # 4-byte elements
    return lambda: other.sum()


def measure(calls: dict[str, Callable[[], object]], repeat: int,
            setup: Callable[[], object] | None = None) -> dict[str, float]:
    """Median ms of each call, the calls taking turns (so a load change hits all alike, and
    each finds the caches holding the others' pools, as a layer finds them in a model)."""
    samples: dict[str, list[float]] = {n: [] for n in calls}
    for fn in calls.values():  # warm-up
        fn()
    for _ in range(repeat):
        for n, fn in calls.items():
            samples[n] += sample_seconds(fn, 1, setup=setup)
    return {n: statistics.median(t) * 1e3 for n, t in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", nargs="+", default=["vllm-cpu", "native-cpu"])
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--seqs", type=int, default=32, help="decode: sequences")
    ap.add_argument("--context", type=int, default=1024, help="decode: cached tokens each")
    ap.add_argument("--new", type=int, default=512, help="prefill: new tokens")
    ap.add_argument("--cached", type=int, default=1024, help="prefill: cached tokens before")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    ap.add_argument("--copy-floor", action="store_true",
                    help="also time copying the blocks each case reads (the memory floor)")
    ap.add_argument("--cold-mb", type=int, default=0,
                    help="read this many MB of other memory before each call (cold caches)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = DTYPES[a.dtype]
    cases = {"decode": f"decode {a.seqs} x {a.context} context",
             "prefill": f"prefill {a.new} after {a.cached} cached"}
    rows = {}
    for c in cases:
        prepared = {b: prepare(b, c, a, dtype) for b in a.backends}
        calls = {b: fn for b, (fn, _) in prepared.items()}
        if a.copy_floor:
            calls["blocks copy"] = blocks_copy(c, a, dtype)
        ms = measure(calls, a.repeat, evictor(a.cold_mb))
        rows.update({(b, c): (ms[b], err) for b, (_, err) in prepared.items()})
        if a.copy_floor:
            rows["blocks copy", c] = (ms["blocks copy"], float("nan"))
    cold = f", caches cold ({a.cold_mb} MB read before each call)" if a.cold_mb else ""
    print(f"{a.dtype}, {a.heads} heads / {a.kv_heads} KV heads x {a.head_dim}, block "
          f"{a.block_size}, {torch.get_num_threads()} threads, median of {a.repeat} "
          f"(backends taking turns){cold}, ms per layer\n")
    timed = [*a.backends, *(["blocks copy"] if a.copy_floor else [])]
    print("| case | " + " | ".join(f"{b} ms" for b in timed) + " | "
          + " | ".join(f"{b} max err" for b in a.backends) + " |")
    print("|---" * (1 + len(timed) + len(a.backends)) + "|")
    for c, label in cases.items():
        ms = " | ".join(f"{rows[b, c][0]:.2f}" for b in timed)
        err = " | ".join(f"{rows[b, c][1]:.1e}" for b in a.backends)
        print(f"| {label} | {ms} | {err} |")


if __name__ == "__main__":
    main()
