"""int8 weights (``model.quantization = "int8"``): the quantizer, our ``int8_gemv`` against
float64 of the same dequantized weight (the shapes of the supported models' linears, 1-64 rows,
per channel and in groups), its dequantization exactly, the layer ops' choice by rows, its
probe, and runners whose greedy answers equal a runner's holding the dequantized weights as
plain bfloat16 up to bfloat16 near-ties (the kernel on the native backend, the reference on
``torch``)."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from hermes_async.config import CacheConfig, ConfigError, ModelConfig
from hermes_async.model.loader import load_model
from hermes_async.model.quant.apply import quantize_model
from hermes_async.model.quant.weights import PAIRS, ROWS, quantize_int8
from hermes_async.model.runner import ModelRunner
from hermes_async.step import SequenceStep
from tests.model.conftest import KERNEL_HEAD_DIM, native_unavailable


def _kernel(dtype: str = "bfloat16", op: str = "int8_gemv_supported") -> bool:
    if native_unavailable() is not None:
        return False
    from hermes_async.model.attention import native

    native.load()
    return bool(getattr(torch.ops.hermes_native, op)(getattr(torch, dtype)))


NEEDS = {"bfloat16": "AVX512-BF16", "float32": "AVX2 and FMA"}


def kernel_dtypes(op: str = "int8_gemv_supported") -> list:
    """The activation dtypes of a quantized GEMV, each skipped where this CPU lacks what its
    kernel needs (bfloat16: AVX512-BF16; float32: AVX2 + FMA)."""
    return [pytest.param(d, marks=pytest.mark.skipif(
        not _kernel(d, op), reason=f"no {op.split('_')[0]} GEMV in {d} here ({NEEDS[d]})"))
        for d in NEEDS]


needs_kernel = pytest.mark.skipif(native_unavailable() is not None,
                                  reason="no native library")

# (N, K) of the linears of the default model (SmolLM2-135M), Qwen3-0.6B/1.7B, a Llama-8B MLP
# slice, and small odd shapes (blocks of 16 outputs, groups of four blocks, remainders)
SHAPES = [(16, 2), (48, 64), (960, 576), (576, 576), (3072, 576), (576, 1536), (4096, 1024),
          (1024, 3072), (2048, 6144), (272, 130), (4096, 96)]
ROW_COUNTS = [1, 2, 3, 5, 8, 9, 16, 17, 33, 64]


@pytest.mark.parametrize("group", [None, 32, 128])
@pytest.mark.parametrize("layout", [ROWS, PAIRS])
def test_quantizer_is_within_half_a_step_and_layouts_agree(group, layout):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(64, 256, generator=gen) * torch.rand(64, 1, generator=gen)
    q = quantize_int8(w, group, layout)
    step = q.rows()[1].repeat_interleave(q.group, dim=1)
    assert ((q.dequantize(torch.float32) - w).abs() <= step / 2 + 1e-7).all()
    assert q.rows()[0].abs().max() <= 127
    other = quantize_int8(w, group, PAIRS if layout == ROWS else ROWS)
    assert torch.equal(q.rows()[0], other.rows()[0])
    assert torch.equal(q.rows()[1], other.rows()[1])
    assert q.nbytes == 64 * 256 + 4 * 64 * (256 // q.group)


def test_quantizer_refusals_and_zero_rows():
    with pytest.raises(ValueError, match="2-D"):
        quantize_int8(torch.zeros(4, 4, 4))
    with pytest.raises(ValueError, match="multiple of the group"):
        quantize_int8(torch.zeros(16, 40), 32)
    with pytest.raises(ValueError, match="N % 16"):
        quantize_int8(torch.zeros(24, 32), None, PAIRS)
    q = quantize_int8(torch.zeros(16, 8), None, PAIRS)
    assert torch.equal(q.dequantize(torch.float32), torch.zeros(16, 8))


ROUNDING = {"bfloat16": 2 ** -8, "float32": 2 ** -22}  # of the output, relative


@pytest.mark.parametrize("dtype", kernel_dtypes())
@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("group", [None, 32])
def test_int8_gemv_matches_float64_of_the_dequantized_weight(n, k, group, dtype):
    """float32 accumulation of exact products, each group's sum scaled once, rounded to the
    activations' dtype at the end: within that rounding of the exact product plus float32
    sums (bfloat16 on AVX512-BF16, float32 on AVX2)."""
    if group is not None and k % group:
        pytest.skip("K not a multiple of the group")
    gen = torch.Generator().manual_seed(n + 7 * k)
    q = quantize_int8(torch.randn(n, k, generator=gen) / k ** 0.5, group, PAIRS)
    exact = q.dequantize(torch.float32).double()
    for rows in ROW_COUNTS:
        x = torch.randn(rows, k, generator=gen).to(getattr(torch, dtype))
        out = torch.empty(rows, n, dtype=x.dtype)
        torch.ops.hermes_native.int8_gemv(out, x, q.values, q.scales)
        ref = x.double() @ exact.T
        bound = (ref.abs() * ROUNDING[dtype] + 1e-5 * (x.double().abs() @ exact.abs().T)
                 + 1e-6)
        assert ((out.double() - ref).abs() <= bound).all(), rows


@needs_kernel
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("group", [None, 32])
def test_int8_dequantize_is_the_reference_exactly(group, dtype):
    gen = torch.Generator().manual_seed(5)
    q = quantize_int8(torch.randn(96, 320, generator=gen), group, PAIRS)
    w = torch.empty(96, 320, dtype=getattr(torch, dtype))
    torch.ops.hermes_native.int8_dequantize(w, q.values, q.scales)
    assert torch.equal(w, q.dequantize(w.dtype))


@needs_kernel
def test_int8_gemv_refuses_what_it_cannot_compute():
    ops = torch.ops.hermes_native
    q = quantize_int8(torch.randn(32, 64), None, PAIRS)
    with pytest.raises(RuntimeError, match="float32 \\[M, 64\\]"):
        ops.int8_gemv(torch.empty(1, 32, dtype=torch.bfloat16),
                      torch.zeros(1, 62, dtype=torch.bfloat16), q.values, q.scales)
    with pytest.raises(RuntimeError, match="int8 \\[N / 16"):
        ops.int8_gemv(torch.empty(1, 32, dtype=torch.bfloat16),
                      torch.zeros(1, 64, dtype=torch.bfloat16), q.values.float(), q.scales)
    with pytest.raises(RuntimeError, match="groups"):
        ops.int8_gemv(torch.empty(1, 32, dtype=torch.bfloat16),
                      torch.zeros(1, 64, dtype=torch.bfloat16), q.values,
                      torch.ones(2, 5, 16))


@pytest.mark.parametrize("dtype", kernel_dtypes())
def test_layer_ops_take_the_gemv_for_few_rows_and_dequantize_for_many(tiny_models, dtype):
    from torch.profiler import ProfilerActivity, profile

    from hermes_async.model.attention.native_cpu import NativeTorchLayerOps
    from hermes_async.model.spec import read_spec

    spec = read_spec(tiny_models("llama", KERNEL_HEAD_DIM))
    dt = getattr(torch, dtype)
    ops = NativeTorchLayerOps(spec, dt, [])
    assert "native-int8" in ops.name
    q = quantize_int8(torch.randn(64, 32), None, PAIRS)
    bias = torch.randn(64).to(dt)
    most = ops.int8_gemv_max_rows
    for rows, kernel in ((1, "int8_gemv"), (most, "int8_gemv"), (most + 1, "int8_dequantize")):
        x = torch.randn(rows, 32).to(dt)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = ops.linear(x, q, bias)
        assert f"hermes_native::{kernel}" in {e.key for e in prof.key_averages()}, rows
        ref = x.double() @ q.dequantize(torch.float32).double().T + bias.double()
        assert (out.double() - ref).abs().max() <= 0.02 * ref.abs().max()
    rows_layout = quantize_int8(torch.randn(64, 32), None, ROWS)  # not the kernel's layout
    x = torch.randn(3, 32).to(dt)
    ref = torch.nn.functional.linear(x, rows_layout.dequantize(dt))
    assert torch.equal(ops.linear(x, rows_layout), ref)


@pytest.mark.parametrize("dtype", kernel_dtypes())
def test_its_probe_admits_it_only_for_int8_models(tiny_models, dtype):
    from hermes_async.model.kernels.paths import NotApplicable
    from hermes_async.model.kernels.probe_ops import probe_native_int8
    from hermes_async.model.kernels.shapes import ProbeShapes
    from hermes_async.model.spec import read_spec

    spec = read_spec(tiny_models("qwen3", KERNEL_HEAD_DIM))
    shapes = ProbeShapes.from_spec(spec, 16, dtype, 1, "int8")
    assert ProbeShapes.from_json(shapes.to_json()) == shapes
    report = probe_native_int8(shapes)
    assert report.ok, report
    with pytest.raises(NotApplicable, match="no int8 weights"):
        probe_native_int8(ProbeShapes.from_spec(spec, 16, dtype, 1))


def test_config_refuses_an_unknown_scheme():
    with pytest.raises(ConfigError, match="model.quantization"):
        ModelConfig(quantization="int3")


def _dequantized_runner(path, backend: str, layout: str, dtype: str = "bfloat16") -> ModelRunner:
    """The oracle: a runner whose linears hold ``q * scale`` as plain weights of ``dtype``."""
    dt = getattr(torch, dtype)
    runner = ModelRunner(path, ModelConfig(dtype=dtype, attention_backend=backend),
                         CacheConfig(kv_cache_bytes=8 << 20))
    # a fresh copy: the runner's own weights may live only in its kernels' copies
    model = runner.model = load_model(path, dtype)
    weights = [getattr(layer, n) for layer in model.layers
               for n in ("qkv_weight", "o_weight", "gate_up_weight", "down_weight")]
    for w in weights:
        if w is not None and not (layout == PAIRS and w.shape[0] % 16):
            w.data.copy_(quantize_int8(w.data, None, layout).dequantize(dt))
    head = model.head_weight  # tied: a dequantized copy; the embedding stays for the lookup
    if not (layout == PAIRS and head.shape[0] % 16):
        deq = quantize_int8(head.data, None, layout).dequantize(dt)
        model.lm_head = torch.nn.Parameter(deq, requires_grad=False)
    model.ops = runner.attention.layer_ops(runner.spec, runner.dtype, model.matmul_weights(),
                                           runner.layer_op_parts)
    return runner


def _decode(runner: ModelRunner, prompts: list[list[int]], steps: int,
            forced: list[list[int]] | None = None) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy continuations of all prompts decoded together (one batch per step), or the
    ``forced`` tokens fed instead; and each step's logits ``[len(prompts), vocab]``."""
    tables = [tuple(range(i * 8, i * 8 + 8)) for i in range(len(prompts))]
    seqs = [list(p) for p in prompts]
    logits = runner.forward([SequenceStep(t, 0, tuple(p)) for t, p in zip(tables, seqs,
                                                                          strict=True)])
    seen = []
    for i in range(steps):
        seen.append(logits.float())
        for j, (s, row) in enumerate(zip(seqs, logits, strict=True)):
            s.append(forced[j][i] if forced else int(row.argmax()))
        logits = runner.forward([SequenceStep(t, len(s) - 1, (s[-1],))
                                 for t, s in zip(tables, seqs, strict=True)])
    return [s[len(p):] for s, p in zip(seqs, prompts, strict=True)], seen


def assert_same_greedy(runner: ModelRunner, oracle: ModelRunner, prompts: list[list[int]],
                       steps: int = 48, share: float = 0.95, margin: float = 0.02) -> None:
    """The runner, fed the oracle's greedy tokens, picks the oracle's token at every step, or
    one the oracle scores within ``margin`` (2%) of its logits' range of its best (a bfloat16
    near-tie: the two round differently -- float32 accumulation against oneDNN's AMX tiles, a few
    bfloat16 steps apart after the layers -- and free-running answers would part there and
    never meet); at least ``share`` of the picks are the oracle's own."""
    tokens, ref = _decode(oracle, prompts, steps)
    _, ours = _decode(runner, prompts, steps, forced=tokens)
    same = 0
    for r, o in zip(ref, ours, strict=True):
        pick = o.argmax(-1)
        best = r.max(-1).values
        spread = best - r.min(-1).values
        chosen = r.gather(-1, pick[:, None]).squeeze(-1)
        assert (chosen >= best - margin * spread).all(), (chosen, best)
        same += int((pick == r.argmax(-1)).sum())
    assert same >= share * steps * len(prompts)


def _greedy(runner: ModelRunner, prompts: list[list[int]], steps: int) -> list[list[int]]:
    return _decode(runner, prompts, steps)[0]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "phi3"])
@pytest.mark.parametrize("backend", ["native-cpu", "torch"])
def test_greedy_answers_equal_the_dequantized_runners(tiny_models, arch, backend, dtype, caplog):
    if backend == "native-cpu" and not _kernel(dtype):
        pytest.skip(f"no int8 kernel in {dtype} here ({NEEDS[dtype]})")
    path = tiny_models(arch, KERNEL_HEAD_DIM)
    with caplog.at_level(logging.INFO, logger="hermes_async.model"):
        runner = ModelRunner(path, ModelConfig(dtype=dtype, attention_backend=backend,
                                               quantization="int8"),
                             CacheConfig(kv_cache_bytes=8 << 20))
    layout = PAIRS if backend == "native-cpu" else ROWS
    assert runner.quantization is not None and runner.quantization.layout == layout
    assert any("quantization: int8 weights" in r.message and "MiB ->" in r.message
               for r in caplog.records)
    if backend == "native-cpu":
        assert "native-int8" in runner.model.ops.name, runner.model.ops.name
    oracle = _dequantized_runner(path, backend, layout, dtype)
    rng = random.Random(arch)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (5, 17, 40)]
    assert_same_greedy(runner, oracle, prompts)


def test_quantize_model_reports_bytes_and_keeps_what_the_layout_cannot_hold(tiny_models):
    model = load_model(tiny_models("llama", KERNEL_HEAD_DIM), "bfloat16", torch.device("cpu"))
    before = sum(p.numel() * 2 for layer in model.layers
                 for p in (layer.qkv_weight, layer.o_weight, layer.gate_up_weight,
                           layer.down_weight))
    report = quantize_model(model, "int8", PAIRS)
    assert report.quantized == 4 * len(model.layers) + (1 if not report.kept_float else 0)
    assert report.bytes_after < 0.6 * report.bytes_before
    assert report.bytes_before >= before
    assert all(not isinstance(w, torch.nn.Parameter) for layer in model.layers
               for w in (layer.qkv_weight, layer.o_weight))
    assert model.matmul_weights() == [] or all(isinstance(w, torch.Tensor)
                                              for w in model.matmul_weights())
