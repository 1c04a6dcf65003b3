"""GGUF files served as they are (``hermes_async.model.gguf``).

Oracles: the Hugging Face checkpoint each tiny GGUF was written from (a float32 GGUF must load
to the same tensors and spec), transformers' own GGUF loader (quantized files: its
dequantization and its reading of llama.cpp's layout against our logits), the tokenizer the
file was written from, and the embedded default model converted by transformers.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from hermes_async.model.gguf.directory import MANIFEST, prepare_gguf_dir
from hermes_async.model.gguf.writer import write_gguf
from hermes_async.model.loader import load_model
from hermes_async.model.spec import ModelLoadError
from hermes_async.model.tokenizer import load_tokenizer
from hermes_async.step import SequenceStep
from tests.model.conftest import BlockAllocator, make_runner
from tests.tiny_models import GGUF_ARCHS, make_tiny_model, make_tiny_tokenizer

SPEC_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
               "num_kv_heads", "head_dim", "tie_word_embeddings", "qkv_bias", "o_bias",
               "sliding_windows", "qk_norm", "pre_norms", "post_norms", "activation",
               "embedding_scale", "residual_scale", "logit_scale", "rope_layers",
               "layer_rope_tables", "moe_layers", "num_experts", "experts_per_token",
               "moe_intermediate_size", "norm_topk_prob")
TEXTS = ("hello world, 12345 ships <|im_start|> on the sea", "  Numbers 3.50\n\nand more")


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory) -> Path:
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def tiny_gguf(tmp: Path, arch: str, qtype: str, tokenizer: Path, **kw: object) -> tuple[Path, Path]:
    """(checkpoint directory, GGUF written from it)."""
    model_dir = make_tiny_model(tmp / arch, arch, gguf_layout=True, **kw)  # type: ignore[arg-type]
    return model_dir, write_gguf(model_dir, tmp / f"{arch}-{qtype}.gguf", qtype,
                                 tokenizer_dir=tokenizer, pre="gpt2")


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 320) for _ in range(n)]


@pytest.mark.parametrize("arch", GGUF_ARCHS)
def test_float_gguf_loads_as_its_checkpoint(arch, tmp_path, tiny_tokenizer):
    model_dir, gguf = tiny_gguf(tmp_path, arch, "F32", tiny_tokenizer)
    served = prepare_gguf_dir(gguf, tmp_path / "home")
    ours, ref = load_model(served, "float32"), load_model(model_dir, "float32")
    for field in SPEC_FIELDS:
        assert getattr(ours.spec, field) == getattr(ref.spec, field), field
    assert ours.spec.scale == pytest.approx(ref.spec.scale, rel=1e-6)
    for (a, x), (b, y) in zip(ours.spec.rope_tables, ref.spec.rope_tables, strict=True):
        assert torch.allclose(a, b) and x == pytest.approx(y)
    ref_params = dict(ref.named_parameters())
    for name, p in ours.named_parameters():  # exact but for Gemma's (w + 1) - 1 + 1
        assert torch.allclose(p, ref_params[name], rtol=0, atol=1e-6), name
    tokenizer, source = load_tokenizer(served), load_tokenizer(tiny_tokenizer)
    for text in TEXTS:
        assert tokenizer(text).input_ids == source(text).input_ids
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    assert (tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            == source.apply_chat_template(messages, add_generation_prompt=True))


# transformers reads these families' GGUF files with their tiny shapes (it takes Qwen3's head
# size from its default, 128: the tiny Qwen3 has that head size)
ORACLE_CASES = [("llama", {}), ("qwen2", {}), ("phi3", {}), ("qwen3", {"head_dim": 128})]


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K"])
@pytest.mark.parametrize(("arch", "shape"), ORACLE_CASES, ids=[a for a, _ in ORACLE_CASES])
def test_quantized_gguf_matches_transformers_dequantized(arch, shape, qtype, tmp_path,
                                                         tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    if qtype == "Q4_K":  # rows of 256-value blocks
        shape = {"head_dim": 64, **shape,  # transformers: hidden / heads where unstated
                 "sizes": {"hidden_size": 256, "intermediate_size": 512}}
    model_dir, gguf = tiny_gguf(tmp_path, arch, qtype, tiny_tokenizer, **shape)
    served = prepare_gguf_dir(gguf, tmp_path / "home")
    assert json.loads((served / MANIFEST).read_text())["tensor_types"][qtype] > 0
    oracle = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf.name,
                                                  dtype=torch.float32).eval()
    unquantized = make_runner(model_dir)
    runner = make_runner(served)
    alloc = BlockAllocator(runner.num_blocks)
    for n in (1, 9, 30):
        ids = prompt(n, seed=n)
        table = tuple(alloc.take(-(-n // runner.block_size)))
        ours = runner.forward([SequenceStep(table, 0, tuple(ids))])[0].cpu()
        plain = unquantized.forward([SequenceStep(table, 0, tuple(ids))])[0].cpu()
        with torch.no_grad():
            ref = oracle(torch.tensor([ids])).logits[0, -1].float()
        assert (ours - ref).abs().max().item() < 1e-3, n
        assert (ours - plain).abs().max().item() > 1e-3, "the file was not quantized"


def test_moe_experts_and_k_quants_load(tmp_path, tiny_tokenizer):
    """Experts merged per layer in a K-quant file come back as each expert's dequantized
    rows (compared with the gguf package's own dequantization of the stacks)."""
    import gguf as gguf_pkg

    _, path = tiny_gguf(tmp_path, "qwen3_moe", "Q4_K", tiny_tokenizer,
                        sizes={"hidden_size": 256, "moe_intermediate_size": 256})
    served = prepare_gguf_dir(path, tmp_path / "home")
    model = load_model(served, "float32")
    reader = gguf_pkg.GGUFReader(str(path))
    stacks = {t.name: torch.from_numpy(gguf_pkg.quants.dequantize(t.data, t.tensor_type).copy())
              for t in reader.tensors if "_exps" in t.name}
    layer = model.layers[0]
    gate, up = stacks["blk.0.ffn_gate_exps.weight"], stacks["blk.0.ffn_up_exps.weight"]
    want = torch.cat([gate, up], dim=1).transpose(1, 2)
    assert torch.equal(layer.experts_gate_up.data, want)
    assert torch.equal(layer.experts_down.data, stacks["blk.0.ffn_down_exps.weight"]
                       .transpose(1, 2))


def test_default_model_from_its_gguf_equals_the_converted_directory(default_model_dir):
    from hermes_async.model.default_model import prepare_default_model

    served = prepare_default_model(progress=False)
    assert not list(served.glob("*.safetensors"))  # no float copy on disk
    a, b = load_model(served, "float32"), load_model(default_model_dir, "float32")
    b_params = dict(b.named_parameters())
    for name, p in a.named_parameters():
        assert torch.equal(p, b_params[name]), name
    ra, rb = make_runner(served, block_size=32), make_runner(default_model_dir, block_size=32)
    tokenizer = load_tokenizer(served)
    for question in ("What is the capital of France?", "Write a haiku about the sea."):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                            add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        outs = []
        for runner in (ra, rb):
            alloc = BlockAllocator(runner.num_blocks)
            table = tuple(alloc.take(-(-(len(ids) + 24) // runner.block_size)))
            seq, out = list(ids), []
            step = SequenceStep(table, 0, tuple(seq))
            for _ in range(24):
                token = int(runner.forward([step])[0].argmax())
                out.append(token)
                step = SequenceStep(table, len(seq), (token,))
                seq.append(token)
            outs.append(out)
        assert outs[0] == outs[1], question


def test_unsupported_and_changed_files_are_refused(tmp_path, tiny_tokenizer):
    import gguf as gguf_pkg

    w = gguf_pkg.GGUFWriter(str(tmp_path / "bert.gguf"), "bert")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="'bert' is not supported.*llama"):
        prepare_gguf_dir(tmp_path / "bert.gguf", tmp_path / "home")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF not really")
    with pytest.raises(ModelLoadError, match="junk.gguf"):
        prepare_gguf_dir(tmp_path / "junk.gguf", tmp_path / "home")

    _, path = tiny_gguf(tmp_path, "llama", "Q8_0", tiny_tokenizer)
    served = prepare_gguf_dir(path, tmp_path / "home")
    assert prepare_gguf_dir(path, tmp_path / "home") == served  # prepared once
    os.utime(path, ns=(1, 1))
    with pytest.raises(ModelLoadError, match="changed since"):
        load_model(served)
    assert prepare_gguf_dir(path, tmp_path / "home") != served  # a new directory for it


def test_resolve_model_path_serves_a_gguf_file(tmp_path, tiny_tokenizer, monkeypatch):
    from hermes_async.model.default_model import resolve_model_path

    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "home"))
    _, path = tiny_gguf(tmp_path, "qwen2", "Q8_0", tiny_tokenizer)
    served = resolve_model_path(path)
    assert served.name == "qwen2-Q8_0" and (served / MANIFEST).is_file()
    assert load_model(served).spec.architecture == "Qwen2ForCausalLM"


def test_partial_rotary_phi_gguf_keeps_its_rotary_size(tmp_path, tiny_tokenizer):
    """A Phi-4-mini-style GGUF (``rope.dimension_count`` below the head size) rotates only that
    part: its spec, RoPE table and logits equal the checkpoint's."""
    import transformers as tf

    from tests.tiny_models import COMMON

    torch.manual_seed(5)
    cfg = tf.Phi3Config(**{**COMMON, "head_dim": 32, "hidden_size": 128},
                        tie_word_embeddings=False, sliding_window=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                         "partial_rotary_factor": 0.75})
    model = tf.Phi3ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.15) if p.dim() >= 2 else p.uniform_(0.5, 1.5)
    model_dir = tmp_path / "phi4-mini"
    model.save_pretrained(model_dir)
    gguf = write_gguf(model_dir, tmp_path / "phi4-mini.gguf", "F32", tokenizer_dir=tiny_tokenizer,
                      pre="gpt2")
    served = prepare_gguf_dir(gguf, tmp_path / "home")
    ours, ref = load_model(served, "float32"), load_model(model_dir, "float32")
    assert ours.spec.rotary_dim == ref.spec.rotary_dim == 24
    assert torch.allclose(ours.spec.inv_freq, ref.spec.inv_freq)
    ids = prompt(20, 6)
    logits = []
    for path in (served, model_dir):
        runner = make_runner(path)
        table = tuple(BlockAllocator(runner.num_blocks).take(3))
        logits.append(runner.forward([SequenceStep(table, 0, tuple(ids))])[0])
    torch.testing.assert_close(logits[0], logits[1], atol=1e-4, rtol=0)
