"""Our experts' grouped GEMVs: ``grouped_gemv`` over the stacked experts and
``grouped_gemv_packed`` over :class:`PackedExperts` (``pack_experts``), each against float64
over row counts per expert (none, fewer than their 4- and 8-row passes, more) and column tails,
their refusals, the native layer ops' choice, the probe, the backend packing a bfloat16 model's
experts, and mixture-of-experts runners giving the same logits with them as with torch's
``_grouped_mm`` (AVX512F CPUs, the packed form AVX512-BF16; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

from tests.model.conftest import KERNEL_HEAD_DIM, native_unavailable


def _supported() -> bool:
    if native_unavailable() is not None:
        return False
    from hermes_async.model.attention import native

    native.load()
    return bool(torch.ops.hermes_native.grouped_gemv_supported())


pytestmark = pytest.mark.skipif(not _supported(), reason="no AVX512F grouped GEMV here")


def grouped(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.shape[2])
    offsets = torch.tensor(counts).cumsum(0).to(torch.int32)
    torch.ops.hermes_native.grouped_gemv(out, x.float().contiguous(), w, offsets)
    return out


def exact(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> torch.Tensor:
    expert = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    return torch.einsum("pk,pkn->pn", x.double(), w[expert].double())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k, n", [(1, 16), (7, 48), (64, 144), (96, 272), (33, 128)])
@pytest.mark.parametrize("counts", [[1], [0, 2, 0, 3], [4, 5, 1, 0, 9], [0, 0, 6], [8, 7]])
def test_matches_each_experts_rows_times_its_weight(dtype, k, n, counts):
    """float32 accumulation of the exact products: within float32 rounding of the float64
    sum (blocks of 128 columns and 16-column tails, 1-4-row groups all covered)."""
    gen = torch.Generator().manual_seed(k * 31 + n + len(counts))
    w = torch.randn(len(counts), k, n, generator=gen).to(dtype)
    x = torch.randn(sum(counts), k, generator=gen).to(dtype)
    ref = exact(x, w, counts)
    ours = grouped(x, w, counts).double()
    assert ((ours - ref).abs() <= 1e-5 * (1 + ref.abs()) * k ** 0.5).all()


def _packed_supported() -> bool:
    return bool(torch.ops.hermes_native.gemv_supported())


needs_packed = pytest.mark.skipif(not _supported() or not _packed_supported(),
                                  reason="no AVX512-BF16 here")


@needs_packed
@pytest.mark.parametrize("k, n", [(2, 16), (64, 48), (96, 144), (130, 272), (32, 1024)])
@pytest.mark.parametrize("counts", [[1], [0, 2, 0, 3], [4, 5, 1, 0, 9], [0, 0, 17], [8, 16]])
def test_packed_matches_each_experts_rows_times_its_weight(k, n, counts):
    """bfloat16 out of float32 sums of exact products: within bfloat16's rounding."""
    from hermes_async.model.packed import PackedExperts

    gen = torch.Generator().manual_seed(k * 31 + n + len(counts))
    w = torch.randn(len(counts), k, n, generator=gen).to(torch.bfloat16)
    x = torch.randn(sum(counts), k, generator=gen).to(torch.bfloat16)
    ops = torch.ops.hermes_native
    packed = ops.pack_experts(w)
    assert torch.equal(PackedExperts(packed, tuple(w.shape)).unpack(), w)
    out = torch.empty(sum(counts), n, dtype=torch.bfloat16)
    ops.grouped_gemv_packed(out, x, packed, torch.tensor(counts).cumsum(0).to(torch.int32))
    ref = exact(x, w, counts)
    bound = ref.abs() * 2 ** -8 + 1e-5 * k ** 0.5 * (1 + ref.abs())
    assert ((out.double() - ref).abs() <= bound).all()


@needs_packed
def test_packed_refusals():
    ops = torch.ops.hermes_native
    with pytest.raises(RuntimeError, match="N % 16"):
        ops.pack_experts(torch.zeros(2, 8, 24, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bfloat16"):
        ops.pack_experts(torch.zeros(2, 8, 32))
    packed = ops.pack_experts(torch.zeros(2, 8, 32, dtype=torch.bfloat16))
    offs = torch.tensor([1, 2], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="offsets end"):
        ops.grouped_gemv_packed(torch.empty(3, 32, dtype=torch.bfloat16),
                                torch.zeros(3, 8, dtype=torch.bfloat16), packed, offs)
    with pytest.raises(RuntimeError, match="bfloat16 \\[P, 8\\]"):
        ops.grouped_gemv_packed(torch.empty(2, 32, dtype=torch.bfloat16), torch.zeros(2, 8),
                                packed, offs)


def test_no_rows_at_all():
    w = torch.randn(3, 8, 32)
    assert grouped(torch.empty(0, 8), w, [0, 0, 0]).shape == (0, 32)


def test_refuses_what_it_cannot_compute():
    op = torch.ops.hermes_native.grouped_gemv
    w = torch.zeros(2, 8, 32)
    offs = torch.tensor([1, 2], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="N % 16"):
        op(torch.empty(2, 24), torch.zeros(2, 8), torch.zeros(2, 8, 24), offs)
    with pytest.raises(RuntimeError, match="float32"):
        op(torch.empty(2, 32), torch.zeros(2, 8, dtype=torch.bfloat16), w, offs)
    with pytest.raises(RuntimeError, match="offsets end"):
        op(torch.empty(3, 32), torch.zeros(3, 8), w, offs)
    with pytest.raises(RuntimeError, match="rise"):
        op(torch.empty(2, 32), torch.zeros(2, 8), w, torch.tensor([2, 1], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="int32"):
        op(torch.empty(2, 32), torch.zeros(2, 8), w, torch.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="float16|bfloat16 or float32"):
        op(torch.empty(2, 32), torch.zeros(2, 8), w.half(), offs)


def test_layer_ops_take_it_for_few_rows_per_expert_only(tiny_models):
    from torch.profiler import ProfilerActivity, profile

    from hermes_async.model.attention.native_cpu import (
        GROUPED_GEMV_ROWS_PER_EXPERT,
        NativeTorchLayerOps,
    )
    from hermes_async.model.spec import read_spec

    spec = read_spec(tiny_models("qwen3_moe", KERNEL_HEAD_DIM))
    ops = NativeTorchLayerOps(spec, torch.bfloat16, [])
    assert "native-moe" in ops.name
    experts = 4
    w = torch.randn(experts, 32, 64).to(torch.bfloat16)
    limit = GROUPED_GEMV_ROWS_PER_EXPERT * experts
    for rows, native in ((1, True), (limit, True), (limit + 1, False)):
        counts = [rows // experts] * experts
        counts[0] += rows - sum(counts)
        x = torch.randn(rows, 32).to(torch.bfloat16)
        offsets = torch.tensor(counts).cumsum(0).to(torch.int32)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = ops.grouped_mm(x, w, offsets)
        names = {e.key for e in prof.key_averages()}
        assert ("hermes_native::grouped_gemv" in names) == native, rows
        assert out.dtype == torch.bfloat16
        ref = exact(x, w, counts)
        assert (out.double() - ref).abs().max() <= 0.01 * ref.abs().max()
    off = NativeTorchLayerOps(spec, torch.bfloat16, [], parts=frozenset())
    assert "native-moe" not in off.name


def test_its_probe_admits_it_for_experts_and_not_without(tiny_models):
    from hermes_async.model.kernels.paths import NotApplicable
    from hermes_async.model.kernels.probe_ops import probe_native_moe
    from hermes_async.model.kernels.shapes import ProbeShapes
    from hermes_async.model.spec import read_spec

    spec = read_spec(tiny_models("qwen3_moe", KERNEL_HEAD_DIM))
    for dtype in ("bfloat16", "float32"):
        shapes = ProbeShapes.from_spec(spec, 16, dtype, 1)
        assert shapes.experts == (spec.num_experts, spec.experts_per_token, spec.hidden_size,
                                  spec.moe_intermediate_size)
        assert ProbeShapes.from_json(shapes.to_json()) == shapes
        report = probe_native_moe(shapes)
        assert report.ok, report
    dense = ProbeShapes.from_spec(read_spec(tiny_models("qwen3", KERNEL_HEAD_DIM)), 16,
                                  "float32", 1)
    assert dense.experts == ()
    with pytest.raises(NotApplicable, match="no mixture-of-experts"):
        probe_native_moe(dense)


def test_a_float32_moe_runner_decodes_through_it_as_through_grouped_mm(tiny_models):
    """A decode step of 3 sequences on the native backend: the same logits (to accumulation
    order) with ``grouped_gemv`` over the stacked experts as with torch's ``_grouped_mm``."""
    from hermes_async.config import CacheConfig, ModelConfig
    from hermes_async.model.runner import ModelRunner
    from hermes_async.step import SequenceStep

    path = tiny_models("qwen3_moe", KERNEL_HEAD_DIM)
    runner = ModelRunner(path, ModelConfig(dtype="float32", attention_backend="native-cpu"),
                         CacheConfig(kv_cache_bytes=8 << 20))
    ops = runner.model.ops
    assert ops._native_moe, ops.name
    assert isinstance(runner.model.layers[0].experts_gate_up, torch.Tensor)
    prompts = [tuple(range(5, 5 + n)) for n in (9, 26, 40)]
    tables = [tuple(range(i * 4, i * 4 + 4)) for i in range(3)]
    for t, p in zip(tables, prompts, strict=True):
        runner.forward([SequenceStep(t, 0, p)])
    step = [SequenceStep(t, len(p), (7,)) for t, p in zip(tables, prompts, strict=True)]
    with_native = runner.forward(step)
    ops._native_moe = False
    try:
        without = runner.forward(step)
    finally:
        ops._native_moe = True
    assert (with_native - without).abs().max() <= 1e-4 * without.abs().max()


@needs_packed
def test_a_bf16_moe_runner_packs_its_experts_and_matches_the_reference(tiny_models, caplog):
    """The native backend packs a bfloat16 model's experts at load (logged) and its mixed
    steps (a prefill with decodes) give the torch reference runner's logits to bfloat16
    rounding; the reference unpacking the same packed experts gives them too."""
    import logging

    from hermes_async.config import CacheConfig, ModelConfig
    from hermes_async.model.packed import PackedExperts
    from hermes_async.model.runner import ModelRunner
    from hermes_async.step import SequenceStep

    path = tiny_models("qwen3_moe", KERNEL_HEAD_DIM)
    with caplog.at_level(logging.INFO, logger="hermes_async.model"):
        runner = ModelRunner(path, ModelConfig(dtype="bfloat16",
                                               attention_backend="native-cpu"),
                             CacheConfig(kv_cache_bytes=8 << 20))
    assert any("expert projections packed" in r.message for r in caplog.records)
    moe = [layer for layer in runner.model.layers if layer.router_weight is not None]
    assert moe and all(isinstance(layer.experts_gate_up, PackedExperts)
                       and isinstance(layer.experts_down, PackedExperts) for layer in moe)
    reference = ModelRunner(path, ModelConfig(dtype="bfloat16", attention_backend="torch"),
                            CacheConfig(kv_cache_bytes=8 << 20))
    prompts = [tuple(range(5, 5 + n)) for n in (9, 26, 40)]
    tables = [tuple(range(i * 4, i * 4 + 4)) for i in range(3)]
    for r in (runner, reference):
        for t, p in zip(tables[:2], prompts[:2], strict=True):
            r.forward([SequenceStep(t, 0, p)])
    step = [SequenceStep(tables[0], len(prompts[0]), (7,)),
            SequenceStep(tables[1], len(prompts[1]), (9,)),
            SequenceStep(tables[2], 0, prompts[2])]
    ours, ref = runner.forward(step), reference.forward(step)
    assert (ours - ref).abs().max() <= 0.05 * ref.abs().max()
    x = torch.randn(5, moe[0].experts_gate_up.shape[1]).to(torch.bfloat16)
    offsets = torch.tensor([0] * (moe[0].experts_gate_up.shape[0] - 1) + [5],
                           dtype=torch.int32)
    from hermes_async.model.layer_ops import TorchLayerOps

    a = runner.model.ops.grouped_mm(x, moe[0].experts_gate_up, offsets)
    b = TorchLayerOps(runner.spec).grouped_mm(x, moe[0].experts_gate_up, offsets)
    assert (a.float() - b.float()).abs().max() <= 0.02 * b.float().abs().max()
