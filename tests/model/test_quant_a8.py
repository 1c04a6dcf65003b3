"""Int8 activations for int8 / int4 linears (``model.activations = "int8"``: W8A8, W4A8).

Oracles: float64 of the dequantized weight times the block-quantized activations
(:func:`hermes_async.model.quant.a8.dequantize_blocks`, itself checked against its definition)
for ``int4_a8_gemv`` and ``int8_a8_gemv`` on the supported models' linear shapes, 1-131 rows,
the groups each scheme brings; and, for whole runners (int8, int4 and a GGUF's Q4_0 blocks),
the same runner with float
activations whose int4 linears are handed the block-quantized activations instead: the greedy
answers must agree.
"""

from __future__ import annotations

import random

import pytest
import torch

from hermes_async.config import CacheConfig, ConfigError, ModelConfig
from hermes_async.model.gguf.directory import prepare_gguf_dir
from hermes_async.model.gguf.writer import write_gguf
from hermes_async.model.quant.a8 import BLOCK, dequantize_blocks, quantize_blocks
from hermes_async.model.quant.weights import (
    PAIRS,
    QuantizedWeight,
    narrow_scales,
    quantize_int4,
    quantize_int8,
)
from hermes_async.model.runner import ModelRunner
from tests.model.conftest import KERNEL_HEAD_DIM, native_unavailable
from tests.model.test_quant_int8 import assert_same_greedy
from tests.tiny_models import make_tiny_model, make_tiny_tokenizer

A8 = {"int4": "native-int4-a8", "int8": "native-int8-a8", "gguf": "native-int4-a8"}
SHAPES = [(16, 32), (48, 64), (960, 576), (576, 1536), (1536, 576), (4096, 1024),
          (2048, 6144), (272, 256)]
ROW_COUNTS = [1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 64, 67, 131]  # tiles of 64 rows


def _a8_kernel() -> bool:
    if native_unavailable() is not None:
        return False
    from hermes_async.model.attention import native

    native.load()
    return bool(torch.ops.hermes_native.a8_supported())


needs_a8 = pytest.mark.skipif(not _a8_kernel(), reason="no W4A8 kernel here (AVX2 and FMA)")


def test_block_quantization_is_its_definition():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 96, generator=gen) * torch.rand(3, 96, generator=gen) * 5
    x[1, 32:64] = 0.0
    q, d = quantize_blocks(x)
    assert q.dtype == torch.int8 and d.shape == (3, 3)
    assert int(q.abs().max()) <= 127 and float(d[1, 1]) == 0.0 and not q[1, 32:64].any()
    blocks = x.reshape(3, 3, BLOCK)
    assert torch.equal(d, blocks.abs().amax(-1) / 127)
    xhat = dequantize_blocks(x)
    step = d.double().repeat_interleave(BLOCK, dim=1)
    assert ((xhat - x.double()).abs() <= step / 2 + 1e-12).all()
    with pytest.raises(ValueError, match="multiples of 32"):
        quantize_blocks(torch.zeros(1, 40))


@needs_a8
@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("scales", ["float32", "float16"])
def test_int4_a8_gemv_matches_float64_of_the_quantized_operands(n, k, group, scales):
    if k % group:
        pytest.skip("K not a multiple of the group")
    gen = torch.Generator().manual_seed(n + 7 * k + group)
    q = quantize_int4(torch.randn(n, k, generator=gen) / k ** 0.5, group, PAIRS)
    if scales == "float16":  # as the native backend narrows them for this kernel
        q = narrow_scales(q)
        assert q is not None and q.scales.dtype == torch.float16
    exact = q.dequantize(torch.float32).double()
    for rows in ROW_COUNTS:
        x = torch.randn(rows, k, generator=gen) * 3
        x[rows // 2, :BLOCK] = 0.0  # a zero block: scale 0
        out = torch.empty(rows, n)
        torch.ops.hermes_native.int4_a8_gemv(out, x, q.values, q.scales, q.mins)
        xhat = dequantize_blocks(x)
        ref = xhat @ exact.T
        bound = 1e-5 * (xhat.abs() @ exact.abs().T) + 1e-6
        assert ((out.double() - ref).abs() <= bound).all(), rows


@needs_a8
@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("group", [None, 32, 16])
def test_int8_a8_gemv_matches_float64_of_the_quantized_operands(n, k, group):
    if group is not None and k % group:
        pytest.skip("K not a multiple of the group")
    gen = torch.Generator().manual_seed(n + 5 * k + (group or 0))
    q = quantize_int8(torch.randn(n, k, generator=gen) / k ** 0.5, group, PAIRS)
    q.values.view(-1)[::97] = -128  # GGUF's Q8_0 blocks may hold it; quantize_int8 does not
    exact = q.dequantize(torch.float32).double()
    for rows in ROW_COUNTS:
        x = torch.randn(rows, k, generator=gen) * 3
        x[rows // 2, :BLOCK] = 0.0
        out = torch.empty(rows, n)
        torch.ops.hermes_native.int8_a8_gemv(out, x, q.values, q.scales)
        xhat = dequantize_blocks(x)
        ref = xhat @ exact.T
        bound = 1e-5 * (xhat.abs() @ exact.abs().T) + 1e-6
        assert ((out.double() - ref).abs() <= bound).all(), rows


@needs_a8
@pytest.mark.parametrize("bits", ["int4", "int8"])
@pytest.mark.parametrize("n, k", [(48, 64), (960, 576), (2048, 6144), (272, 256)])
def test_a8_gemvs_in_bfloat16_give_float32s_output_rounded(bits, n, k):
    """bfloat16 in and out (the runner's call) is the float32 call on the same values with
    its output rounded to nearest even, bit for bit, at every tile and pass size."""
    gen = torch.Generator().manual_seed(n + k)
    weight = torch.randn(n, k, generator=gen) / k ** 0.5
    if bits == "int4":
        q = quantize_int4(weight, 32, PAIRS)
        half = narrow_scales(q)
        operands = [(q.values, q.scales, q.mins)] + (
            [(half.values, half.scales, half.mins)] if half is not None else [])
        gemv = torch.ops.hermes_native.int4_a8_gemv
    else:
        q = quantize_int8(weight, None, PAIRS)
        operands = [(q.values, q.scales)]
        gemv = torch.ops.hermes_native.int8_a8_gemv
    for rows in ROW_COUNTS:
        x = (torch.randn(rows, k, generator=gen) * 3).bfloat16()
        x[rows // 2, :BLOCK] = 0.0
        for tensors in operands:
            out32 = torch.empty(rows, n)
            gemv(out32, x.float(), *tensors)
            out = torch.full((rows, n), float("nan"), dtype=torch.bfloat16)
            gemv(out, x, *tensors)
            assert torch.equal(out, out32.bfloat16()), rows


@needs_a8
def test_int4_a8_gemv_refuses_what_it_cannot_take():
    q = quantize_int4(torch.randn(16, 48), 16, PAIRS)
    with pytest.raises(RuntimeError, match="multiples of 32"):
        torch.ops.hermes_native.int4_a8_gemv(torch.empty(1, 16), torch.randn(1, 48), q.values,
                                             q.scales, q.mins)
    q = quantize_int4(torch.randn(16, 64), 32, PAIRS)
    with pytest.raises(RuntimeError, match="x's dtype"):  # bfloat16 out of float32 x
        torch.ops.hermes_native.int4_a8_gemv(torch.empty(1, 16, dtype=torch.bfloat16),
                                             torch.randn(1, 64), q.values, q.scales, q.mins)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        torch.ops.hermes_native.int4_a8_gemv(torch.empty(1, 16, dtype=torch.float16),
                                             torch.randn(1, 64).half(), q.values, q.scales,
                                             q.mins)
    q = quantize_int8(torch.randn(16, 64), 8, PAIRS)
    with pytest.raises(RuntimeError, match="groups of 16"):
        torch.ops.hermes_native.int8_a8_gemv(torch.empty(1, 16), torch.randn(1, 64), q.values,
                                             q.scales)


@needs_a8
def test_its_probe_admits_it_for_int4_and_int8_models_only(tiny_models):
    from hermes_async.model.kernels.paths import NotApplicable
    from hermes_async.model.kernels.probe_ops import probe_native_int4_a8, probe_native_int8_a8
    from hermes_async.model.kernels.shapes import ProbeShapes
    from hermes_async.model.spec import read_spec

    spec = read_spec(tiny_models("qwen3", KERNEL_HEAD_DIM))
    for scheme in ("int4", "gguf"):
        report = probe_native_int4_a8(ProbeShapes.from_spec(spec, 16, "float32", 1, scheme))
        assert report.ok, report
    with pytest.raises(NotApplicable, match="no int4 weights"):
        probe_native_int4_a8(ProbeShapes.from_spec(spec, 16, "float32", 1, "int8"))
    # bfloat16 models too: their activations are widened to float32 for the kernel
    report = probe_native_int4_a8(ProbeShapes.from_spec(spec, 16, "bfloat16", 1, "int4"))
    assert report.ok, report
    vnni = torch.ops.hermes_native.a8_vnni()
    assert ("AVX512-VNNI" if vnni else "AVX2") in report.detail
    assert ("vpermb" in report.detail) == torch.ops.hermes_native.a8_wide()
    for scheme in ("int8", "gguf"):
        report = probe_native_int8_a8(ProbeShapes.from_spec(spec, 16, "float32", 1, scheme))
        assert report.ok, report
    with pytest.raises(NotApplicable, match="no int8 weights"):
        probe_native_int8_a8(ProbeShapes.from_spec(spec, 16, "float32", 1, "int4"))


def test_the_setting_needs_int8_or_int4_weights():
    for scheme in ("int8", "int4", "int4-g128", "gguf"):
        assert ModelConfig(quantization=scheme, activations="int8").activations == "int8"
    for scheme in ("none", "w8a8"):
        with pytest.raises(ConfigError, match="needs int8 / int4 weights"):
            ModelConfig(quantization=scheme, activations="int8")
    with pytest.raises(ConfigError, match="float or int8"):
        ModelConfig(quantization="int4", activations="fp8")


def _block_quantized_inputs(runner: ModelRunner) -> None:
    """The oracle: ``runner``'s int8 / int4 linears (float activations) handed ``x^`` instead
    of ``x`` in the steps the int8-activation kernels take (any number of rows, K in whole
    blocks, the group too or, int8, half a block)."""
    ops = runner.model.ops
    plain = ops.quantized_linear

    def quantized_linear(x: torch.Tensor, weight: QuantizedWeight,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
        n, k = weight.shape
        rows = x.numel() // k
        group_fits = weight.group % BLOCK == 0 or (weight.scheme == "int8"
                                                   and weight.group == BLOCK // 2)
        if k % BLOCK == 0 and group_fits:
            x = dequantize_blocks(x.reshape(rows, k)).to(x.dtype).view(x.shape)
        return plain(x, weight, bias)

    ops.quantized_linear = quantized_linear


def _runners(path, quantization: str, dtype: str = "float32"
             ) -> tuple[ModelRunner, ModelRunner]:
    def runner(activations: str) -> ModelRunner:
        return ModelRunner(path, ModelConfig(dtype=dtype, attention_backend="native-cpu",
                                             quantization=quantization,
                                             activations=activations),
                           CacheConfig(kv_cache_bytes=8 << 20))

    ours, oracle = runner("int8"), runner("float")
    path_name = A8[quantization]
    assert path_name in ours.model.ops.name, ours.model.ops.name
    assert "-a8" not in oracle.model.ops.name
    assert path_name.removesuffix("-a8") in oracle.model.ops.name
    _block_quantized_inputs(oracle)
    int4 = [q for q in ours.model.quantized_weights() if q.scheme == "int4"]
    # the a8 runner's int4 weights carry float16 scales and mins (20 bytes a group of 32),
    # the same values as the oracle's float32 ones
    assert all(q.scales.dtype == q.mins.dtype == torch.float16 for q in int4)
    for q, plain_q in zip(int4, (q for q in oracle.model.quantized_weights()
                                 if q.scheme == "int4"), strict=True):
        assert plain_q.scales.dtype == torch.float32
        assert torch.equal(q.scales.float(), plain_q.scales)
    return ours, oracle


def _prompts(seed: str) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(n)] for n in (5, 17, 40)]


@needs_a8
@pytest.mark.parametrize(("arch", "scheme"), [("llama", "int4"), ("qwen3", "int4"),
                                              ("gemma3", "int4"), ("llama", "int8"),
                                              ("phi3", "int8")])
def test_runner_answers_as_its_block_quantized_oracle(tiny_models, arch, scheme):
    ours, oracle = _runners(tiny_models(arch, KERNEL_HEAD_DIM), scheme)
    assert_same_greedy(ours, oracle, _prompts(arch))


def _bf16_quantized_kernels() -> bool:
    ops = torch.ops.hermes_native
    return (_a8_kernel() and ops.int4_gemv_supported(torch.bfloat16)
            and ops.int8_gemv_supported(torch.bfloat16))


@pytest.mark.skipif(not _bf16_quantized_kernels(),
                    reason="no bfloat16 int8 / int4 kernels here (AVX512-BF16)")
@pytest.mark.parametrize(("arch", "scheme"), [("qwen3", "int4"), ("llama", "int8")])
def test_bfloat16_runner_answers_as_its_block_quantized_oracle(tiny_models, arch, scheme):
    """bfloat16 models: the activations widened to float32 for the byte kernels, the outputs
    rounded back (the oracle: the bfloat16 runner handed x^ in bfloat16)."""
    ours, oracle = _runners(tiny_models(arch, KERNEL_HEAD_DIM), scheme, "bfloat16")
    # 0.9 of the picks: the bfloat16 oracle rounds x^ and its sums again, and itself parts from
    # the float32 one more often than the kernel does (llama int8: 138 against 141 of 144);
    # a pick within 3% of the logits' range (qwen3 int4: one at 2.6%, the same with float32 or
    # float16 scales: a near-tie of this random model's weights, the scales float16 values)
    assert_same_greedy(ours, oracle, _prompts(arch), share=0.9, margin=0.03)


@needs_a8
def test_gguf_q4_0_runner_answers_as_its_block_quantized_oracle(tmp_path):
    model_dir = make_tiny_model(tmp_path / "llama", "llama", gguf_layout=True, head_dim=64,
                                sizes={"hidden_size": 128, "intermediate_size": 256})
    path = write_gguf(model_dir, tmp_path / "llama-Q4_0.gguf", "Q4_0",
                      tokenizer_dir=make_tiny_tokenizer(tmp_path / "tokenizer"), pre="gpt2")
    ours, oracle = _runners(prepare_gguf_dir(path, tmp_path / "home"), "gguf")
    assert_same_greedy(ours, oracle, _prompts("gguf"))


@needs_a8
def test_float_activations_leave_it_unused(tiny_models):
    runner = ModelRunner(tiny_models("llama", KERNEL_HEAD_DIM),
                         ModelConfig(dtype="float32", attention_backend="native-cpu",
                                     quantization="int4"),
                         CacheConfig(kv_cache_bytes=8 << 20))
    assert not {*A8.values()} & runner.layer_op_parts and "-a8" not in runner.model.ops.name


def test_a8_kernels_are_bounded_in_rows_only_for_bfloat16_with_amx():
    from hermes_async.model.attention.native_cpu import a8_gemv_max_rows
    from hermes_async.model.cpu_features import CpuFeatures

    amx_cpu = CpuFeatures(frozenset({"avx2", "fma", "amx_bf16", "amx_tile"}))
    assert all(isinstance(most, int) and most >= 64 for most in a8_gemv_max_rows(amx_cpu))
    # float32 models: AMX's tiles do not multiply them, the kernels take every step
    assert a8_gemv_max_rows(amx_cpu, torch.float32) == (float("inf"), float("inf"))
    assert a8_gemv_max_rows(CpuFeatures(frozenset({"avx2", "fma", "avx512_bf16"}))) == (
        float("inf"), float("inf"))


@needs_a8
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_layer_ops_dequantize_past_the_a8_row_limit(tiny_models, scheme):
    from torch.profiler import ProfilerActivity, profile

    from hermes_async.model.attention.native_cpu import (
        NATIVE_INT4,
        NATIVE_INT4_A8,
        NATIVE_INT8,
        NATIVE_INT8_A8,
        NativeTorchLayerOps,
    )
    from hermes_async.model.spec import read_spec

    spec = read_spec(tiny_models("llama", KERNEL_HEAD_DIM))
    ops = NativeTorchLayerOps(spec, torch.float32, [], frozenset(
        {NATIVE_INT8, NATIVE_INT8_A8} if scheme == "int8" else {NATIVE_INT4, NATIVE_INT4_A8}))
    ops.int8_a8_max_rows = ops.int4_a8_max_rows = 4  # as an AMX CPU's limits, smaller
    ops.int8_gemv_max_rows = ops.int4_gemv_max_rows = 2
    weight = torch.randn(64, 64)
    q = quantize_int8(weight, None, PAIRS) if scheme == "int8" else quantize_int4(weight, 32, PAIRS)
    for rows, kernel in ((4, f"{scheme}_a8_gemv"), (5, f"{scheme}_dequantize")):
        x = torch.randn(rows, 64)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = ops.linear(x, q, None)
        assert f"hermes_native::{kernel}" in {e.key for e in prof.key_averages()}, rows
        ref = x.double() @ q.dequantize(torch.float32).double().T
        assert (out.double() - ref).abs().max() <= 0.02 * ref.abs().max()


@needs_a8
def test_float16_scales_never_reach_int4_gemv(tiny_models):
    """Past the a8 kernel's rows (or with it off) a weight whose scales were narrowed is
    dequantized (``int4_dequantize`` reads float16 ones), never handed to ``int4_gemv``
    (which reads float32 only and refuses the rest)."""
    from torch.profiler import ProfilerActivity, profile

    from hermes_async.model.attention.native_cpu import NATIVE_INT4, NativeTorchLayerOps
    from hermes_async.model.spec import read_spec

    spec = read_spec(tiny_models("llama", KERNEL_HEAD_DIM))
    ops = NativeTorchLayerOps(spec, torch.float32, [], frozenset({NATIVE_INT4}))
    q = narrow_scales(quantize_int4(torch.randn(64, 64), 32, PAIRS))
    assert q is not None
    x = torch.randn(1, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = ops.linear(x, q, None)
    assert "hermes_native::int4_dequantize" in {e.key for e in prof.key_averages()}
    ref = x.double() @ q.dequantize(torch.float32).double().T
    assert (out.double() - ref).abs().max() <= 1e-4 * ref.abs().max()
    with pytest.raises(RuntimeError, match="float32 scales"):
        torch.ops.hermes_native.int4_gemv(torch.empty(1, 64), x, q.values, q.scales, q.mins)
