"""The loader reads any Llama-family HF directory and fails clearly on anything else."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hermes_async.model.kv_pool import derive_block_size
from hermes_async.model.loader import load_model
from hermes_async.model.spec import ModelLoadError, read_spec


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_spec_reads_shape_and_family_options(tiny_arch_dir):
    spec = read_spec(tiny_arch_dir)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (4, 2, 16)
    family = spec.architecture
    if family == "Gemma3ForConditionalGeneration":  # its text part: Gemma 3's decoder
        family = "Gemma3ForCausalLM"
    assert spec.qkv_bias is (family in ("Qwen2ForCausalLM", "SeedOssForCausalLM"))
    assert spec.o_bias is False
    assert spec.tie_word_embeddings is (family in ("LlamaForCausalLM", "GraniteForCausalLM",
                                                   "SmolLM3ForCausalLM", "Gemma3ForCausalLM",
                                                   "Gemma2ForCausalLM"))
    assert spec.sliding_windows[0] == (40 if family in ("MistralForCausalLM", "Gemma3ForCausalLM",
                                                        "Gemma2ForCausalLM") else None)
    assert spec.qk_norm == {"Qwen3ForCausalLM": "head", "Olmo2ForCausalLM": "full",
                            "Gemma3ForCausalLM": "head", "Qwen3MoeForCausalLM": "head"}.get(
        family, "none")
    assert spec.moe_layers == ((True, False, True) if family == "Qwen3MoeForCausalLM" else ())
    if spec.moe_layers:
        assert (spec.num_experts, spec.experts_per_token, spec.moe_intermediate_size) == (8, 2, 48)
        assert spec.norm_topk_prob
    assert spec.pre_norms is (family != "Olmo2ForCausalLM")
    assert spec.post_norms is (family in ("Olmo2ForCausalLM", "Gemma3ForCausalLM",
                                          "Gemma2ForCausalLM"))
    assert (spec.attn_softcap, spec.final_softcap) == (
        (2.0, 5.0) if family == "Gemma2ForCausalLM" else (None, None))
    if family == "Gemma2ForCausalLM":  # alternating local and global layers, one RoPE base
        assert spec.sliding_windows == (40, None, 40) and spec.layer_rope_tables == ()
        assert spec.activation == "gelu_tanh" and spec.embedding_scale == 8.0
        assert spec.scale == 24 ** -0.5
        return
    if family == "Gemma3ForCausalLM":  # local layers (0, 2) on their own RoPE base
        assert spec.layer_rope_tables == (1, 0, 1) and spec.sliding_windows[1] is None
        assert spec.activation == "gelu_tanh" and spec.embedding_scale == 8.0
        assert spec.scale == 24 ** -0.5
        return
    assert spec.rope_layers == ((True, False, True) if family == "SmolLM3ForCausalLM" else ())
    if family == "GraniteForCausalLM":
        assert (spec.embedding_scale, spec.residual_scale, spec.scale, spec.logit_scale) == (
            3.0, 0.5, 0.1, 0.25)
    else:
        assert spec.scale == 16 ** -0.5 and spec.logit_scale == 1.0


def test_bfloat16_load_casts_weights(tiny_dir):
    model = load_model(tiny_dir, "bfloat16")
    assert model.embed.dtype == torch.bfloat16
    assert model.layers[0].qkv_weight.dtype == torch.bfloat16


def test_unsupported_architecture_is_named(tiny_dir, tmp_path):
    d = copy_model(tiny_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="GPTNeoXForCausalLM"):
        load_model(d)


def test_missing_config_is_named(tiny_dir, tmp_path):
    d = copy_model(tiny_dir, tmp_path / "m")
    (d / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(d)


def test_missing_weights_are_named(tiny_dir, tmp_path):
    d = copy_model(tiny_dir, tmp_path / "m")
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_model(d)


def test_corrupt_weights_file_is_named(tiny_dir, tmp_path):
    d = copy_model(tiny_dir, tmp_path / "m")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load_model(d)


def test_missing_tensor_is_named(tiny_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    d = copy_model(tiny_dir, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.down_proj\.weight"):
        load_model(d)


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match="nowhere"):
        load_model(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("kv_heads", "head_dim", "expected"),
    [(3, 64, 32), (8, 128, 16), (2, 64, 64), (1, 64, 128), (32, 128, 16)],
)
def test_block_size_rule(kv_heads, head_dim, expected):
    assert derive_block_size(kv_heads, head_dim) == expected


def test_host_allocator_tuning_applies_on_linux():
    import sys

    from hermes_async.model.host_memory import keep_freed_memory, return_freed_memory

    assert keep_freed_memory() is sys.platform.startswith("linux")
    assert return_freed_memory() is sys.platform.startswith("linux")
