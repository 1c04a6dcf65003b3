"""Our own C++ kernels (``native-cpu``) against the torch reference backend, op by op: decode,
prefill chunks after a cached prefix, mixed steps, GQA groupings, head and block sizes,
float32 and bfloat16. (The runner-level parity suite runs it too: conftest.BACKEND_CASES.)

Both backends get the same step on pools of their own layouts; the cached prefix is written
by each backend's own write path (a fill step), then the step under test is compared."""

from __future__ import annotations

import random

import pytest
import torch

from hermes_async.config import ModelConfig
from hermes_async.model.attention import BackendUnavailable, TorchBackend, select_backend
from hermes_async.model.kv_pool import KVPool, KVPoolShape
from hermes_async.step import SequenceStep
from tests.model.conftest import KERNEL_HEAD_DIM, native_unavailable

pytestmark = pytest.mark.skipif(native_unavailable() is not None,
                                reason=native_unavailable() or "")

CPU = torch.device("cpu")


def make_native(heads: int, kv_heads: int, d: int, bs: int, dtype: torch.dtype):
    from hermes_async.model.attention.native_cpu import NativeCpuBackend

    return NativeCpuBackend(bs, heads, kv_heads, d, dtype, [None])


def make_steps(spec: list[tuple[int, int]], bs: int, seed: int = 0) -> list[SequenceStep]:
    """Steps of (cached tokens, new tokens), block ids shuffled through the pool."""
    ids = list(range(sum(-(-(c + n) // bs) for c, n in spec)))
    random.Random(seed).shuffle(ids)
    steps = []
    for cached, new in spec:
        need = -(-(cached + new) // bs)
        steps.append(SequenceStep(tuple(ids[:need]), cached, (5,) * new))
        ids = ids[need:]
    return steps


def slots(steps: list[SequenceStep], bs: int) -> torch.Tensor:
    return torch.tensor([s.block_table[p // bs] * bs + p % bs for s in steps
                         for p in range(s.start_pos, s.context_len)], dtype=torch.long)


def attend_both(spec: list[tuple[int, int]], heads: int, kv_heads: int, d: int, bs: int,
                dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(native-cpu's output, the reference's in float32) of one step after the prefix."""
    steps = make_steps(spec, bs, seed)
    gen = torch.Generator().manual_seed(seed)
    ctx = sum(c + n for c, n in spec)
    q_all, k_all, v_all = (torch.randn(ctx, h, d, generator=gen).to(dtype)
                           for h in (heads, kv_heads, kv_heads))
    new = torch.tensor([i for s, o in zip(steps, _offsets(steps), strict=True)
                        for i in range(o + s.start_pos, o + s.context_len)], dtype=torch.long)
    old = torch.tensor([i for s, o in zip(steps, _offsets(steps), strict=True)
                        for i in range(o, o + s.start_pos)], dtype=torch.long)
    fill = [SequenceStep(s.block_table, 0, (5,) * s.start_pos) for s in steps if s.start_pos]
    outs = []
    for backend, dt in ((make_native(heads, kv_heads, d, bs, dtype), dtype),
                        (TorchBackend(bs, CPU, use_cascade=False), torch.float32)):
        num_blocks = max(b for s in steps for b in s.block_table) + 1
        pool = KVPool(KVPoolShape(1, num_blocks, bs, kv_heads, d, dt), CPU, backend.kv_layout)
        kv = pool.blocks(0)
        scale = d ** -0.5
        if fill:
            plan = backend.plan(fill, slots(fill, bs), backend.order(fill))
            plan.attend(kv, q_all[old].to(dt), k_all[old].to(dt), v_all[old].to(dt), scale,
                        None)
        ordering = backend.order(steps)
        assert ordering.indices == sorted(ordering.indices), "cases are given packed"
        plan = backend.plan(steps, slots(steps, bs), ordering)
        outs.append(plan.attend(kv, q_all[new].to(dt), k_all[new].to(dt), v_all[new].to(dt),
                                scale, None).float())
        if backend.kv_layout == "hnd":  # the pool holds plain K/V rows, as KVPool.gather reads
            s = steps[-1]
            k_ctx, _ = pool.gather(0, torch.tensor(s.block_table), s.context_len)
            o = _offsets(steps)[-1]
            assert torch.equal(k_ctx, k_all[o:o + s.context_len])
    return outs[0], outs[1]


def _offsets(steps: list[SequenceStep]) -> list[int]:
    out, total = [], 0
    for s in steps:
        out.append(total)
        total += s.context_len
    return out


def tolerance(dtype: torch.dtype) -> float:
    """float32: rounding only (1e-6 seen); bfloat16: the output's own rounding (up to 0.008
    seen at these magnitudes) plus P rounded to bfloat16 in the packed path: 2x that."""
    return 2e-5 if dtype == torch.float32 else 1.6e-2


DTYPES = [torch.float32, torch.bfloat16]
SHAPES = [(4, 2, 32, 32), (9, 3, 64, 32), (8, 8, 40, 16), (8, 1, 128, 16), (12, 4, 96, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-kv{}-d{}-bs{}".format(*s))
def test_decode_matches_the_reference(dtype, shape):
    heads, kv_heads, d, bs = shape
    spec = [(c, 1) for c in (0, 1, bs - 1, bs, bs + 1, 3 * bs + 7, 200)]
    ours, ref = attend_both(spec, heads, kv_heads, d, bs, dtype)
    assert (ours - ref).abs().max().item() < tolerance(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-kv{}-d{}-bs{}".format(*s))
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_few_long_decodes_split_their_context_and_match(dtype, shape, threads):
    """One or two long decodes are fewer items than the threads want: their contexts are cut
    into parts merged by log-sum-exp (split.h); parts of uneven length, a last part of one
    key, a decode too short to split beside them."""
    heads, kv_heads, d, bs = shape
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for spec in ([(1039, 1)], [(4999, 1), (700, 1)], [(256, 1)], [(2 * 256, 1), (9, 1)]):
            ours, ref = attend_both(spec, heads, kv_heads, d, bs, dtype, seed=len(spec))
            assert (ours - ref).abs().max().item() < tolerance(dtype), spec
    finally:
        torch.set_num_threads(before)


def test_a_long_decode_beside_a_prefill_chunk_matches():
    """Splits happen in mixed steps too (the prefill tile stays whole)."""
    spec = [(3000, 1), (40, 20)]
    ours, ref = attend_both(spec, 9, 3, 64, 32, torch.bfloat16, seed=11)
    assert (ours - ref).abs().max().item() < tolerance(torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-kv{}-d{}-bs{}".format(*s))
def test_prefill_chunks_after_a_cached_prefix_match_the_reference(dtype, shape):
    heads, kv_heads, d, bs = shape
    # fresh prompts, chunks after whole cached blocks and after a partial block, long chunks
    # (several tiles), chunks of one block and less
    for spec in ([(0, 37)], [(2 * bs, 50)], [(bs + 5, 3)], [(130, 100)], [(0, bs)]):
        ours, ref = attend_both(spec, heads, kv_heads, d, bs, dtype, seed=len(spec))
        assert (ours - ref).abs().max().item() < tolerance(dtype), spec


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_mixed_step_matches_the_reference(dtype):
    heads, kv_heads, d, bs = 9, 3, 64, 32
    spec = [(17, 1), (64, 1), (100, 1), (0, 40), (96, 33), (5, 70), (250, 2)]
    # decodes first, then prefill chunks: the packed order both backends use
    spec = sorted(spec, key=lambda cn: cn[1] != 1)
    ours, ref = attend_both(spec, heads, kv_heads, d, bs, dtype, seed=3)
    assert (ours - ref).abs().max().item() < tolerance(dtype)


def test_the_op_refuses_bad_inputs():
    ops = torch.ops.hermes_native
    q = torch.zeros(2, 4, 32)
    cache = torch.zeros(4, 2, 16, 32)
    args = (torch.tensor([0, 2], dtype=torch.int32), torch.tensor([40], dtype=torch.int32),
            torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="block table is too narrow"):
        ops.paged_attention(torch.empty_like(q), q, cache, cache, *args, 0.1)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        ops.paged_attention(torch.empty(2, 4, 36), torch.zeros(2, 4, 36),
                            torch.zeros(4, 2, 16, 36), torch.zeros(4, 2, 16, 36), *args, 0.1)
    with pytest.raises(RuntimeError, match="outside the pool"):
        ops.write_kv(torch.zeros(1, 2, 32), torch.zeros(1, 2, 32), cache, cache,
                     torch.tensor([64]))


def test_the_backend_is_a_configurable_choice(tiny_models):
    from hermes_async.model.spec import read_spec

    assert ModelConfig(attention_backend="native-cpu").attention_backend == "native-cpu"
    spec = read_spec(tiny_models("llama", KERNEL_HEAD_DIM))
    choice = select_backend("native-cpu", spec, 32, torch.float32, CPU)
    assert choice.backend.name == "native-cpu" and choice.backend.kv_layout == "hnd"
    assert choice.reason == "native-cpu (configured)"
    with pytest.raises(BackendUnavailable, match="multiple of 8"):
        select_backend("native-cpu", spec, 12, torch.bfloat16, CPU)
    windowed = select_backend("native-cpu", read_spec(tiny_models("mistral", KERNEL_HEAD_DIM)),
                              32, torch.bfloat16, CPU)  # sliding windows: in the kernel
    assert windowed.backend.name == "native-cpu"


def test_auto_leads_with_it_only_where_it_measured_faster(tiny_models, monkeypatch):
    """bfloat16 on an AVX512-BF16 CPU without AMX (BENCHMARKS.md); float32 stays vLLM's
    (ours after it, for the sliding-window models vLLM's kernels are not given)."""
    from hermes_async.model.attention import auto_order, native
    from hermes_async.model.spec import read_spec

    measured_here = (torch.cpu._is_avx512_bf16_supported()
                     and not torch.cpu._is_amx_tile_supported())
    assert (auto_order(CPU, torch.bfloat16)[0] == "native-cpu") == measured_here
    assert auto_order(CPU, torch.float32) == ["vllm-cpu", "native-cpu"]
    spec = read_spec(tiny_models("llama", KERNEL_HEAD_DIM))
    if measured_here:
        choice = select_backend("auto", spec, 32, torch.bfloat16, CPU)
        assert choice.backend.name == "native-cpu" and choice.reason == "native-cpu (auto)"

        def not_built() -> None:
            raise BackendUnavailable("the native kernels are not built")

        monkeypatch.setattr(native, "load", not_built)
        choice = select_backend("auto", spec, 32, torch.bfloat16, CPU)
        assert choice.backend.name != "native-cpu"
        assert "native-cpu unavailable: the native kernels are not built" in choice.reason
    assert select_backend("auto", spec, 32, torch.float32, CPU).backend.name != "native-cpu"


def test_without_a_compiler_the_build_says_so(monkeypatch, tmp_path):
    from hermes_async.model.attention import native

    monkeypatch.setenv("HERMES_HOME", str(tmp_path))  # nothing built there
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(BackendUnavailable, match="no C.. compiler"):
        native.build()
    monkeypatch.setattr(native, "loaded", lambda: False)
    with pytest.raises(BackendUnavailable, match="not built"):
        native.load()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("threads", [1, 2])
def test_sliding_windows_against_float64(dtype, threads):
    """Windows shorter than a block, across blocks and longer than the context, through every
    path (prefill tiles of 16+ rows, decodes, a long decode split into parts) on the probe's
    script of steps, against float64 attention."""
    from hermes_async.model.kernels.probe_attention import probe_backend
    from hermes_async.model.kernels.shapes import ProbeShapes

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for heads, kv_heads in ((4, 2), (9, 3)):
            shapes = ProbeShapes(dtype=dtype, num_heads=heads, num_kv_heads=kv_heads,
                                 head_dim=64, block_size=32, hidden_size=256,
                                 intermediate_size=512, linears=((256, 256),),
                                 windows=(None, 5, 33, 70, 4096), num_threads=threads)
            report = probe_backend(
                shapes, "hermes_async.model.attention.native_cpu:NativeCpuBackend")
            assert report.ok, report
    finally:
        torch.set_num_threads(before)
