"""A GGUF's blocks kept as int8 / int4 weights (``model.quantization = "gguf"``).

Oracles: the ``gguf`` package's own dequantizer (every exact block type must dequantize to its
values bit for bit, on random blocks), the same GGUF loaded with its tensors dequantized to
float (the weights equal; the greedy answers of the two runners the same), and float64 for the
int8 / int4 kernels on the group sizes GGUF brings (the probes).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.gguf.blocks import EXACT, REQUANTIZED, decode_blocks
from hermes_async.model.gguf.directory import prepare_gguf_dir
from hermes_async.model.gguf.writer import write_gguf
from hermes_async.model.loader import load_model
from hermes_async.model.quant.apply import LAYER_WEIGHTS
from hermes_async.model.quant.weights import (
    PAIRS,
    ROWS,
    QuantizedWeight,
    concat_rows,
    quantize_int4,
    quantize_int8,
    regroup,
    to_pairs,
)
from hermes_async.model.runner import ModelRunner
from hermes_async.model.spec import ModelLoadError
from tests.model.test_quant_int8 import NEEDS, _kernel, assert_same_greedy
from tests.tiny_models import make_tiny_model, make_tiny_tokenizer

# the float16 fields of each exact type's block (byte offsets): set to sane values, the rest of
# a block's bytes random (every bit pattern of the integers is a valid block)
HALVES = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q4_K": (0, 2),
          "Q6_K": (208,)}
INT8, INT4 = "int8_gemv_supported", "int4_gemv_supported"
# rows of 256 values (K-quants), hidden 256 so every linear is quantized
SIZES = {"hidden_size": 256, "intermediate_size": 512}


def random_blocks(kind: str, n: int, k: int, seed: int) -> np.ndarray:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    for at in HALVES[kind]:
        half = (rng.standard_normal((n, k // block, 1)) * 0.02).astype(np.float16)
        raw[..., at:at + 2] = half.view(np.uint8)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("kind", sorted(EXACT))
@pytest.mark.parametrize(("n", "k"), [(32, 512), (24, 256), (1, 768)])
def test_exact_blocks_dequantize_to_the_files_values(kind, n, k):
    import gguf

    raw = random_blocks(kind, n, k, seed=n + k)
    q = decode_blocks(raw, kind, (n, k))
    assert (q.scheme, q.group, q.layout) == (*EXACT[kind], ROWS)
    want = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).copy())
    assert torch.equal(q.dequantize(torch.float32), want)
    if q.scheme == "int8":
        assert q.values.dtype == torch.int8 and q.mins is None
    else:
        assert q.values.dtype == torch.uint8 and int(q.values.max()) <= 15


def test_pairs_regroup_and_fusing_keep_the_values():
    gen = torch.Generator().manual_seed(3)
    a = quantize_int4(torch.randn(32, 128, generator=gen), 32)
    b = quantize_int4(torch.randn(16, 128, generator=gen), 32)
    c = quantize_int8(torch.randn(16, 128, generator=gen), 32)
    d = quantize_int8(torch.randn(32, 128, generator=gen), 16)
    index = torch.tensor([0, 9, 5, 15, 9])
    for q in (a, c, d):
        assert torch.equal(to_pairs(q).dequantize(torch.float32), q.dequantize(torch.float32))
        for layout in (q, to_pairs(q)):  # an embedding lookup in the table
            assert torch.equal(layout.dequantize_rows(index, torch.bfloat16),
                               q.dequantize(torch.bfloat16)[index])
        assert torch.equal(regroup(q, 8).dequantize(torch.float32), q.dequantize(torch.float32))
    with pytest.raises(ValueError, match="pairs layout"):
        to_pairs(quantize_int8(torch.randn(24, 128, generator=gen), 32))

    fused, changed = concat_rows([a, b])  # int4 beside int4: the integers as they are
    assert (fused.scheme, fused.group, changed) == ("int4", 32, 0)
    assert torch.equal(fused.dequantize(torch.float32),
                       torch.cat([a.dequantize(torch.float32), b.dequantize(torch.float32)]))
    fused, changed = concat_rows([c, d])  # groups of 32 beside 16: scales repeated
    assert (fused.scheme, fused.group, changed) == ("int8", 16, 0)
    assert torch.equal(fused.dequantize(torch.float32),
                       torch.cat([c.dequantize(torch.float32), d.dequantize(torch.float32)]))
    fused, changed = concat_rows([a, b, c])  # a Q4_K q/k beside a Q6_K v: int8 throughout
    assert (fused.scheme, fused.group, changed) == ("int8", 32, 2)
    exact = torch.cat([x.dequantize(torch.float32) for x in (a, b, c)])
    step = fused.rows()[1].repeat_interleave(32, dim=1)
    assert ((fused.dequantize(torch.float32) - exact).abs() <= step / 2 + 1e-7).all()
    assert torch.equal(fused.dequantize(torch.float32)[48:], c.dequantize(torch.float32))


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory) -> Path:
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_tokenizer):
    """(arch, qtype) -> the prepared directory of a tiny GGUF, written once."""
    made: dict[tuple[str, str], Path] = {}

    def get(arch: str, qtype: str) -> Path:
        if (arch, qtype) not in made:
            tmp = tmp_path_factory.mktemp(f"{arch}-{qtype}")
            model_dir = make_tiny_model(tmp / arch, arch, gguf_layout=True, head_dim=64,
                                        sizes=SIZES)
            path = write_gguf(model_dir, tmp / f"{arch}-{qtype}.gguf", qtype,
                              tokenizer_dir=tiny_tokenizer, pre="gpt2")
            made[arch, qtype] = prepare_gguf_dir(path, tmp / "home")
        return made[arch, qtype]

    return get


def _linears(model) -> list[tuple[str, object]]:
    out = [("head", model.head_weight)]
    for i, layer in enumerate(model.layers):
        out += [(f"{i}.{name}", getattr(layer, name)) for name in LAYER_WEIGHTS]
    return [(n, w) for n, w in out if w is not None]


@pytest.mark.parametrize(("arch", "qtype"), [("llama", "Q8_0"), ("llama", "Q4_1"),
                                             ("qwen3", "Q4_K"), ("gemma3", "Q4_0"),
                                             ("phi3", "Q5_0"), ("qwen2", "Q8_0")])
def test_loaded_blocks_equal_the_dequantized_weights(served, arch, qtype):
    """Every linear (and the LM head) holds the file's integers, dequantizing to exactly the
    float load's weights; no float parameter is left for them."""
    path = served(arch, qtype)
    plain = load_model(path, "float32")
    model = load_model(path, "float32", quantization="gguf")
    report = model.quant_report
    assert report is not None and report.scheme == "gguf"
    assert model.embed is None, "the token table stayed float"
    scheme = EXACT[qtype][0]
    assert set(report.sources) == {f"{qtype} -> {scheme}"}, report.describe()
    for (name, w), (_, ref) in zip(_linears(model), _linears(plain), strict=True):
        assert isinstance(w, QuantizedWeight) and w.scheme == scheme, name
        assert torch.equal(w.dequantize(torch.float32), ref.data), name
    params = {n for n, _ in model.named_parameters()}
    assert not any(n.endswith(LAYER_WEIGHTS) or n == "lm_head" for n in params), params
    index = torch.tensor([3, 200, 3, 319])
    if plain.lm_head is None:  # tied: the head's blocks are the embedding table too
        assert model.embed is None and "embed" not in params
        assert torch.equal(model.quantized_head.dequantize_rows(index, torch.float32),
                           plain.embed.data[index])
    else:  # its own blocks
        assert model.embed is None and "embed" not in params
        assert torch.equal(model.quantized_embed.dequantize_rows(index, torch.float32),
                           plain.embed.data[index])
    assert report.quantized == len(_linears(model)) + (model.quantized_embed is not None)
    assert report.bytes_after < report.bytes_before / 3


def test_other_block_types_become_int8_from_their_values(served):
    """Q5_1 (5 bits and an offset: no exact form) is int8 within half a step of its values."""
    path = served("llama", "Q5_1")
    plain = load_model(path, "float32")
    model = load_model(path, "float32", quantization="gguf")
    assert set(model.quant_report.sources) == {f"Q5_1 -> {REQUANTIZED}"}
    for (name, w), (_, ref) in zip(_linears(model), _linears(plain), strict=True):
        step = w.rows()[1].repeat_interleave(w.group, dim=1)
        assert ((w.dequantize(torch.float32) - ref.data).abs() <= step / 2 + 1e-7).all(), name


def test_a_mixed_file_fuses_its_4_bit_and_8_bit_parts_as_int8(tmp_path, tiny_tokenizer):
    """As in llama.cpp's ``Q4_K_M``: q and k in Q4_K beside v in Q8_0 make one int8 q/k/v (v's
    integers as they are, q's and k's within half an int8 step), down in Q5_1 int8 from its
    values, the rest Q4_K as int4; the runner answers as the dequantized file."""
    model_dir = make_tiny_model(tmp_path / "qwen3", "qwen3", gguf_layout=True, head_dim=64,
                                sizes=SIZES)
    path = write_gguf(model_dir, tmp_path / "mixed.gguf", "Q4_K", tokenizer_dir=tiny_tokenizer,
                      pre="gpt2", types={"attn_v.weight": "Q8_0", "ffn_down.weight": "Q5_1"})
    served_dir = prepare_gguf_dir(path, tmp_path / "home")
    plain = load_model(served_dir, "float32")
    model = load_model(served_dir, "float32", quantization="gguf")
    report = model.quant_report
    layers = len(model.layers)
    # Q4_K: q, k, o, gate and up of each layer, the head, and an untied token table
    tables = 1 + (model.quantized_embed is not None)
    assert report.sources == {"Q4_K -> int4": 5 * layers + tables, "Q8_0 -> int8": layers,
                              f"Q5_1 -> {REQUANTIZED}": layers}, report.describe()
    assert report.fused_to_int8 == 2 * layers
    spec = model.spec
    for layer, ref in zip(model.layers, plain.layers, strict=True):
        qkv = layer.qkv_weight
        assert (qkv.scheme, layer.gate_up_weight.scheme) == ("int8", "int4")
        got, want = qkv.dequantize(torch.float32), ref.qkv_weight.data
        v = spec.q_size + spec.kv_size
        assert torch.equal(got[v:], want[v:])
        step = qkv.rows()[1].repeat_interleave(qkv.group, dim=1)
        assert ((got - want).abs() <= step / 2 + 1e-7).all()
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (5, 17, 40)]
    assert_same_greedy(_runner(served_dir, "torch", "float32", "gguf"),
                       _runner(served_dir, "torch", "float32"), prompts)


def test_a_hugging_face_directory_is_refused(tmp_path):
    model_dir = make_tiny_model(tmp_path / "llama", "llama")
    with pytest.raises(ModelLoadError, match="quantization gguf keeps a GGUF file's blocks"):
        load_model(model_dir, "float32", quantization="gguf")


def _runner(path: Path, backend: str, dtype: str, quantization: str = "none",
            kv_bytes: int = 8 << 20) -> ModelRunner:
    return ModelRunner(path, ModelConfig(dtype=dtype, attention_backend=backend,
                                         quantization=quantization),
                       CacheConfig(kv_cache_bytes=kv_bytes))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("backend", ["native-cpu", "torch"])
@pytest.mark.parametrize(("arch", "qtype"), [("llama", "Q4_1"), ("qwen3", "Q4_K"),
                                             ("gemma3", "Q8_0")])
def test_greedy_answers_equal_the_dequantized_files(served, arch, qtype, backend, dtype):
    """Served with its blocks the GGUF answers as served dequantized (our kernels where
    admitted, in the pairs layout; the reference otherwise)."""
    scheme = EXACT[qtype][0]
    if backend == "native-cpu" and not _kernel(dtype, INT8 if scheme == "int8" else INT4):
        pytest.skip(f"no {scheme} GEMV in {dtype} here ({NEEDS[dtype]})")
    path = served(arch, qtype)
    runner = _runner(path, backend, dtype, "gguf")
    assert runner.quantization is not None
    assert runner.quantization.layout == (PAIRS if backend == "native-cpu" else ROWS)
    table = runner.model.quantized_embed
    held = sum(q.nbytes for q in runner.model.quantized_weights()) + (table.nbytes if table
                                                                        else 0)
    assert runner.quantization.bytes_after == held
    if backend == "native-cpu":
        assert f"native-{scheme}" in runner.model.ops.name, runner.model.ops.name
    rng = random.Random(arch)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (5, 17, 40)]
    assert_same_greedy(runner, _runner(path, backend, dtype), prompts)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_probes_cover_the_groups_gguf_brings(served, dtype):
    from hermes_async.model.kernels.probe_ops import probe_native_int4, probe_native_int8
    from hermes_async.model.kernels.shapes import ProbeShapes
    from hermes_async.model.spec import read_spec

    spec = read_spec(served("llama", "Q8_0"))
    shapes = ProbeShapes.from_spec(spec, 16, dtype, 1, "gguf")
    for probe, kernel in ((probe_native_int8, INT8), (probe_native_int4, INT4)):
        if not _kernel(dtype, kernel):
            continue
        report = probe(shapes)
        assert report.ok, report
        if kernel == INT8:
            assert "groups of 32 and 16" in report.detail, report


def test_the_default_model_keeps_its_wheels_blocks():
    """The embedded model's GGUF (Q4_1 linears, a Q8_0 tied table) served with its blocks:
    int4 and int8 weights, the table looked up in the head's blocks, the answers of the
    dequantized file (the machine's dtype and backend, as a server runs it)."""
    from hermes_async.model.default_model import prepare_default_model

    path = prepare_default_model()
    runner = _runner(path, "auto", "auto", "gguf", 64 << 20)
    report = runner.quantization
    assert report.sources == {"Q4_1 -> int4": 210, "Q8_0 -> int8": 1}, report.describe()
    assert runner.model.embed is None
    # Q4_1 is 5 bits a weight, Q8_0 8.5: under 7 on average with the scales, in any dtype
    weights = report.bytes_before / runner.dtype.itemsize
    assert 8 * report.bytes_after / weights < 7, report.describe()
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 40000) for _ in range(n)] for n in (6, 30)]
    assert_same_greedy(runner, _runner(path, "auto", "auto", kv_bytes=64 << 20), prompts, steps=24)
