"""int4 weights (``model.quantization = "int4"`` / ``"int4-g128"``): the quantizer, our
``int4_gemv`` against float64 of the same dequantized weight (the supported models' linear
shapes, 1-33 rows, groups of 32 and 128), its dequantization, the layer ops' choice by rows, its
probe, and runners whose greedy answers equal a runner's holding the dequantized weights."""

from __future__ import annotations

import random

import pytest
import torch

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.loader import load_model
from hermes_async.model.quant.weights import PAIRS, ROWS, narrow_scales, quantize_int4
from hermes_async.model.runner import ModelRunner
from tests.model.conftest import KERNEL_HEAD_DIM, native_unavailable
from tests.model.test_quant_int8 import NEEDS, ROUNDING, _kernel, assert_same_greedy, kernel_dtypes

INT4 = "int4_gemv_supported"
needs_kernel = pytest.mark.skipif(native_unavailable() is not None,
                                  reason="no native library")

SHAPES = [(16, 32), (48, 64), (960, 576), (576, 1536), (1536, 576), (4096, 1024),
          (2048, 6144), (272, 256)]
ROW_COUNTS = [1, 2, 3, 5, 8, 9, 16, 17, 33]


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("layout", [ROWS, PAIRS])
def test_quantizer_is_within_half_a_step_and_layouts_agree(group, layout):
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(32, 256, generator=gen) * torch.rand(32, 1, generator=gen) + 0.3
    q = quantize_int4(w, group, layout)
    values, scales, mins = q.rows()
    assert int(values.max()) <= 15 and mins is not None
    step = scales.repeat_interleave(group, dim=1)
    assert ((q.dequantize(torch.float32) - w).abs() <= step / 2 + 1e-6).all()
    other = quantize_int4(w, group, PAIRS if layout == ROWS else ROWS)
    assert all(torch.equal(a, b) for a, b in zip(q.rows(), other.rows(), strict=True))
    assert q.nbytes == (32 * 256 // (2 if layout == PAIRS else 1)) + 2 * 4 * 32 * (256 // group)


@pytest.mark.parametrize("layout", [ROWS, PAIRS])
def test_scales_and_mins_are_float16_values_that_narrow_losslessly(layout):
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(32, 256, generator=gen) * torch.rand(32, 1, generator=gen) + 0.3
    q = quantize_int4(w, 32, layout)
    half = narrow_scales(q)
    assert half is not None and half.scales.dtype == half.mins.dtype == torch.float16
    assert torch.equal(half.dequantize(torch.float32), q.dequantize(torch.float32))
    assert half.nbytes == q.nbytes - 2 * 2 * 32 * (256 // 32)  # 20 bytes a group, not 24
    values, scales, _ = q.rows()
    assert int(values.max()) <= 15 and int(values.min()) >= 0
    # a scale rounded up to float16 still spans its group's range in 15 steps
    groups = w.reshape(32, 8, 32)
    assert ((groups.amax(-1) - groups.amin(-1)) / 15 <= scales).all()
    assert narrow_scales(half) is None  # already narrow
    # out of float16's normal range: the scales stay float32 (and do not narrow)
    for far in (w * 1e6, w * 1e-7):
        wide = quantize_int4(far, 32, layout)
        assert narrow_scales(wide) is None
        step = wide.rows()[1].repeat_interleave(32, dim=1)
        assert ((wide.dequantize(torch.float32) - far).abs() <= step / 2 * (1 + 1e-5)).all()


def test_quantizer_refusals_and_constant_groups():
    with pytest.raises(ValueError, match="multiple of the group"):
        quantize_int4(torch.zeros(16, 40), 32)
    with pytest.raises(ValueError, match="N % 16"):
        quantize_int4(torch.zeros(24, 32), 32, PAIRS)
    w = torch.full((16, 64), 0.25)
    assert torch.equal(quantize_int4(w, 32, PAIRS).dequantize(torch.float32), w)


@pytest.mark.parametrize("dtype", kernel_dtypes(INT4))
@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("group", [32, 128])
def test_int4_gemv_matches_float64_of_the_dequantized_weight(n, k, group, dtype):
    if k % group:
        pytest.skip("K not a multiple of the group")
    gen = torch.Generator().manual_seed(n + 3 * k + group)
    q = quantize_int4(torch.randn(n, k, generator=gen) / k ** 0.5, group, PAIRS)
    exact = q.dequantize(torch.float32).double()
    for rows in ROW_COUNTS:
        x = torch.randn(rows, k, generator=gen).to(getattr(torch, dtype))
        out = torch.empty(rows, n, dtype=x.dtype)
        torch.ops.hermes_native.int4_gemv(out, x, q.values, q.scales, q.mins)
        ref = x.double() @ exact.T
        bound = (ref.abs() * ROUNDING[dtype] + 1e-5 * (x.double().abs() @ exact.abs().T)
                 + 1e-6)
        assert ((out.double() - ref).abs() <= bound).all(), rows


@needs_kernel
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("scales", ["float32", "float16"])
def test_int4_dequantize_is_the_reference_to_one_rounding(dtype, scales):
    gen = torch.Generator().manual_seed(5)
    q = quantize_int4(torch.randn(96, 256, generator=gen), 32, PAIRS)
    if scales == "float16":
        q = narrow_scales(q)
        assert q is not None and q.scales.dtype == q.mins.dtype == torch.float16
    w = torch.empty(96, 256, dtype=getattr(torch, dtype))
    torch.ops.hermes_native.int4_dequantize(w, q.values, q.scales, q.mins)
    exact = q.dequantize(torch.float32)
    # float32: q * scale + min may be contracted to one FMA (the cancellation near zero)
    assert ((w.float() - exact).abs() <= exact.abs() * ROUNDING[dtype] + 1e-6).all()


@pytest.mark.parametrize("dtype", kernel_dtypes(INT4))
def test_layer_ops_take_the_gemv_for_few_rows_and_dequantize_for_many(tiny_models, dtype):
    from torch.profiler import ProfilerActivity, profile

    from hermes_async.model.attention.native_cpu import NativeTorchLayerOps
    from hermes_async.model.spec import read_spec

    spec = read_spec(tiny_models("llama", KERNEL_HEAD_DIM))
    dt = getattr(torch, dtype)
    ops = NativeTorchLayerOps(spec, dt, [])
    assert "native-int4" in ops.name
    q = quantize_int4(torch.randn(64, 64), 32, PAIRS)
    most = ops.int4_gemv_max_rows
    for rows, kernel in ((1, "int4_gemv"), (most, "int4_gemv"), (most + 1, "int4_dequantize")):
        x = torch.randn(rows, 64).to(dt)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = ops.linear(x, q)
        assert f"hermes_native::{kernel}" in {e.key for e in prof.key_averages()}, rows
        ref = x.double() @ q.dequantize(torch.float32).double().T
        assert (out.double() - ref).abs().max() <= 0.02 * ref.abs().max()


@pytest.mark.parametrize("dtype", kernel_dtypes(INT4))
def test_its_probe_admits_it_only_for_int4_models(tiny_models, dtype):
    from hermes_async.model.kernels.paths import NotApplicable
    from hermes_async.model.kernels.probe_ops import probe_native_int4
    from hermes_async.model.kernels.shapes import ProbeShapes
    from hermes_async.model.spec import read_spec

    spec = read_spec(tiny_models("qwen3", KERNEL_HEAD_DIM))
    for scheme in ("int4", "int4-g128"):
        shapes = ProbeShapes.from_spec(spec, 16, dtype, 1, scheme)
        try:
            report = probe_native_int4(shapes)
        except NotApplicable as e:  # the tiny model's K < 128
            assert scheme == "int4-g128", e
            continue
        assert report.ok, report
    with pytest.raises(NotApplicable, match="no int4 weights"):
        probe_native_int4(ProbeShapes.from_spec(spec, 16, dtype, 1, "int8"))


def _dequantized_runner(path, backend: str, layout: str, group: int,
                        dtype: str = "bfloat16") -> ModelRunner:
    dt = getattr(torch, dtype)
    runner = ModelRunner(path, ModelConfig(dtype=dtype, attention_backend=backend),
                         CacheConfig(kv_cache_bytes=8 << 20))
    # a fresh copy: the runner's own weights may live only in its kernels' copies
    model = runner.model = load_model(path, dtype)

    def ok(w: torch.Tensor) -> bool:
        return not (w.shape[1] % group or (layout == PAIRS and w.shape[0] % 16))

    for layer in model.layers:
        for name in ("qkv_weight", "o_weight", "gate_up_weight", "down_weight"):
            w = getattr(layer, name)
            if w is not None and ok(w):
                w.data.copy_(quantize_int4(w.data, group, layout).dequantize(dt))
    head = model.head_weight
    if ok(head):
        deq = quantize_int4(head.data, group, layout).dequantize(dt)
        model.lm_head = torch.nn.Parameter(deq, requires_grad=False)
    model.ops = runner.attention.layer_ops(runner.spec, runner.dtype, model.matmul_weights(),
                                           runner.layer_op_parts)
    return runner


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("backend", ["native-cpu", "torch"])
def test_greedy_answers_equal_the_dequantized_runners(tiny_models, arch, backend, dtype):
    if backend == "native-cpu" and not _kernel(dtype, INT4):
        pytest.skip(f"no int4 kernel in {dtype} here ({NEEDS[dtype]})")
    path = tiny_models(arch, KERNEL_HEAD_DIM)
    runner = ModelRunner(path, ModelConfig(dtype=dtype, attention_backend=backend,
                                           quantization="int4"),
                         CacheConfig(kv_cache_bytes=8 << 20))
    layout = PAIRS if backend == "native-cpu" else ROWS
    assert runner.quantization is not None and runner.quantization.layout == layout
    assert runner.quantization.quantized > 0
    if backend == "native-cpu":
        assert "native-int4" in runner.model.ops.name, runner.model.ops.name
    oracle = _dequantized_runner(path, backend, layout, 32, dtype)
    rng = random.Random(arch)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (5, 17, 40)]
    assert_same_greedy(runner, oracle, prompts)
