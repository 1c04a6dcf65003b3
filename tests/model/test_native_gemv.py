"""Our small-batch GEMV (``hermes_native::gemv_packed``): the op against float64, its
refusals, and the native backend's layer ops and runner using it for decode steps of up to
8 rows (bfloat16, AVX512-BF16 CPUs; skipped elsewhere, where nothing is packed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.model.conftest import KERNEL_HEAD_DIM, native_unavailable


def _supported() -> bool:
    if native_unavailable() is not None:
        return False
    from hermes_async.model.attention import native

    native.load()
    return bool(torch.ops.hermes_native.gemv_supported())


pytestmark = pytest.mark.skipif(not _supported(), reason="no AVX512-BF16 GEMV on this CPU")


def gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    ops = torch.ops.hermes_native
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.bfloat16)
    ops.gemv_packed(out, x, ops.pack_for_gemv(weight))
    return out


@pytest.mark.parametrize("n, k", [(16, 2), (48, 64), (960, 576), (576, 1536), (4096, 96)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
def test_matches_x_times_weight_transposed(n, k, rows):
    """Every output within its bfloat16 rounding plus float32 accumulation (blocks of 16
    outputs, groups of four blocks and the remainder all covered by these shapes)."""
    gen = torch.Generator().manual_seed(n * 7 + k + rows)
    weight = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    exact = x.double() @ weight.double().T
    ours = gemv(x, weight).double()
    assert ((ours - exact).abs() <= exact.abs() * 2 ** -8 + 1e-4 * k ** 0.5).all()


def test_refuses_what_it_cannot_compute():
    ops = torch.ops.hermes_native
    w = torch.zeros(32, 8, dtype=torch.bfloat16)
    packed = ops.pack_for_gemv(w)
    with pytest.raises(RuntimeError, match="1 to 8 rows"):
        ops.gemv_packed(torch.empty(9, 32, dtype=torch.bfloat16),
                        torch.zeros(9, 8, dtype=torch.bfloat16), packed)
    with pytest.raises(RuntimeError, match="columns"):
        ops.gemv_packed(torch.empty(1, 32, dtype=torch.bfloat16),
                        torch.zeros(1, 10, dtype=torch.bfloat16), packed)
    with pytest.raises(RuntimeError, match="N % 16"):
        ops.pack_for_gemv(torch.zeros(24, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bfloat16"):
        ops.pack_for_gemv(torch.zeros(32, 8))


def test_layer_ops_take_it_for_few_bf16_rows_only(tiny_models):
    from hermes_async.model.attention.native_cpu import NativeTorchLayerOps
    from hermes_async.model.spec import read_spec

    spec = read_spec(tiny_models("llama", KERNEL_HEAD_DIM))
    weight = torch.randn(64, 32).to(torch.bfloat16)
    ops = NativeTorchLayerOps(spec, torch.bfloat16, [weight])
    assert id(weight) in ops._gemv
    from torch.profiler import ProfilerActivity, profile

    for rows, uses_gemv in ((1, True), (8, True), (9, False), (32, False)):
        x = torch.randn(rows, 32).to(torch.bfloat16)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = ops.linear(x, weight)
        names = {e.key for e in prof.key_averages()}
        assert ("hermes_native::gemv_packed" in names) == uses_gemv, rows
        ref = F.linear(x.float(), weight.float())
        assert (out.float() - ref).abs().max() <= 0.01 * ref.abs().max()
    assert NativeTorchLayerOps(spec, torch.float32, [weight.float()])._gemv == {}


def test_runner_decodes_through_it_as_through_the_matmul(tiny_models, monkeypatch):
    """A bf16 decode step of 3 sequences on the native backend: the same logits (to bf16
    rounding) with the GEMV as with it switched off."""
    from hermes_async.config import CacheConfig, ModelConfig
    from hermes_async.model.attention import native_cpu
    from hermes_async.model.runner import ModelRunner
    from hermes_async.step import SequenceStep

    path = tiny_models("llama", KERNEL_HEAD_DIM)
    runner = ModelRunner(path, ModelConfig(dtype="bfloat16", attention_backend="native-cpu"),
                         CacheConfig(kv_cache_bytes=8 << 20))
    ops = runner.model.ops
    assert ops._gemv, "the tiny model's weights are packed"
    bs = runner.block_size
    prompts = [tuple(range(5, 5 + n)) for n in (9, 26, 40)]
    tables = [tuple(range(i * 4, i * 4 + 4)) for i in range(3)]
    for t, p in zip(tables, prompts, strict=True):
        runner.forward([SequenceStep(t, 0, p)])
    step = [SequenceStep(t, len(p), (7,)) for t, p in zip(tables, prompts, strict=True)]
    assert all(len(p) + 1 <= 4 * bs for p in prompts)
    with_gemv = runner.forward(step)
    monkeypatch.setattr(native_cpu, "GEMV_MAX_ROWS", 0)  # every linear to the matmul
    without = runner.forward(step)
    assert (with_gemv - without).abs().max() <= 0.02 * without.abs().max()


def _vllm_layer_ops_or_skip(runner) -> None:
    if "onednn-linear" not in runner.model.ops.parts:
        pytest.skip(f"no oneDNN linears here ({runner.model.ops.name})")


@pytest.mark.parametrize("arch", ["qwen3", "granite"])  # untied, tied embeddings
def test_runner_keeps_only_the_kernels_copies_of_its_linears(tiny_models, arch):
    """Where every linear has both our GEMV's copy and oneDNN's (more rows, biases), the
    loaded weights are released (NaN broadcasts), a tied embedding table too (its lookup then
    reads the GEMV's copy); prefills (oneDNN) and decodes (GEMV) give the logits of the same
    kernels over a model that kept its weights."""
    from hermes_async.config import CacheConfig, ModelConfig
    from hermes_async.model.attention.native_cpu import is_released
    from hermes_async.model.layer_ops import TorchLayerOps
    from hermes_async.model.loader import load_model
    from hermes_async.model.runner import ModelRunner
    from hermes_async.step import SequenceStep

    path = tiny_models(arch, KERNEL_HEAD_DIM)
    runner = ModelRunner(path, ModelConfig(dtype="bfloat16", attention_backend="native-cpu"),
                         CacheConfig(kv_cache_bytes=8 << 20))
    _vllm_layer_ops_or_skip(runner)
    model = runner.model
    linears = [w for layer in model.layers
               for w in (layer.qkv_weight, layer.o_weight, layer.gate_up_weight,
                         layer.down_weight)]
    assert all(is_released(w) and w.isnan().all() for w in linears)
    assert is_released(model.head_weight)
    assert is_released(model.embed) == (model.lm_head is None)  # tied: the head's table
    kept = load_model(path, "bfloat16")
    kept.ops = runner.attention.layer_ops(runner.spec, runner.dtype, kept.matmul_weights(),
                                          runner.layer_op_parts)
    assert kept.ops.name == model.ops.name
    # what a one-row step reads of each released weight: the GEMV's packing of its values
    for w, loaded in zip(model.matmul_weights(), kept.matmul_weights(), strict=True):
        assert torch.equal(model.ops.decode_copy(w), torch.ops.hermes_native.pack_for_gemv(loaded))
    assert TorchLayerOps(runner.spec).decode_copy(kept.head_weight) is kept.head_weight
    tables = [tuple(range(i * 4, i * 4 + 4)) for i in range(2)]
    prompts = [tuple(range(5, 5 + n)) for n in (19, 33)]
    prefill = [SequenceStep(t, 0, p) for t, p in zip(tables, prompts, strict=True)]
    decode = [SequenceStep(t, len(p), (7,)) for t, p in zip(tables, prompts, strict=True)]
    released = [runner.forward(prefill), runner.forward(decode)]
    model_ops, runner.model = runner.model, kept
    try:
        reference = [runner.forward(prefill), runner.forward(decode)]
    finally:
        runner.model = model_ops
    for ours, ref in zip(released, reference, strict=True):
        assert torch.equal(ours, ref)


def test_weights_with_a_onednn_copy_are_packed_past_the_budget(tiny_models, monkeypatch):
    """The packed copies' budget binds only the weights that would keep their loaded copy
    beside it (no oneDNN handle to read them for more rows)."""
    from hermes_async.model.attention import native_cpu
    from hermes_async.model.attention.native_cpu import (
        NativeTorchLayerOps,
        NativeVllmLayerOps,
        is_released,
    )
    from hermes_async.model.attention.vllm_cpu import load_ops
    from hermes_async.model.spec import read_spec

    spec = read_spec(tiny_models("llama", KERNEL_HEAD_DIM))
    weights = [torch.randn(64, 32).to(torch.bfloat16) for _ in range(3)]
    kept = weights[0].clone()
    monkeypatch.setattr(native_cpu, "GEMV_MAX_WEIGHT_BYTES", 64 * 32 * 2)
    alone = NativeTorchLayerOps(spec, torch.bfloat16, weights)
    assert list(alone._gemv) == [id(weights[0])]  # one fits the budget
    assert alone.release_float_weights() == 0  # no other copy reads them: all kept
    assert not any(is_released(w) for w in weights)
    try:
        vllm_ops = load_ops()
    except Exception as exc:  # noqa: BLE001 - the library is optional
        pytest.skip(f"vLLM's CPU ops do not load: {exc}")
    both = NativeVllmLayerOps(spec, torch.bfloat16, vllm_ops, weights,
                              frozenset({"native-gemv", "onednn-linear"}))
    assert set(both._gemv) == {id(w) for w in weights}
    assert both.release_float_weights() == 3 * 64 * 32 * 2
    assert all(is_released(w) for w in weights)
    assert both.release_float_weights() == 0  # once
    x = torch.randn(12, 32).to(torch.bfloat16)  # past the GEMV's rows: oneDNN's copy
    ref = F.linear(x.float(), kept.float())
    out = both.linear(x, weights[0]).float()
    assert (out - ref).abs().max() <= 0.01 * ref.abs().max()
