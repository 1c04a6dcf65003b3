"""Tiny random-weight Llama-family checkpoints for fast tests (built in the test, never fetched).

Each is saved by transformers itself, so the same directory is both what hermes_async loads and
what the oracle (transformers' own model class) loads.
"""

from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def make_tiny_model(path: Path, arch: str = "llama", seed: int = 0,
                    head_dim: int = 16) -> Path:
    """Write a random tiny ``arch`` (llama, qwen2, mistral) checkpoint to ``path``
    (``head_dim`` 32 or more for the kernel backends, which take no smaller heads)."""
    import transformers as tf

    torch.manual_seed(seed)
    common = {**COMMON, "head_dim": head_dim}
    if arch == "llama":
        cfg = tf.LlamaConfig(**common, tie_word_embeddings=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        model = tf.LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(**common, tie_word_embeddings=False)
        model = tf.Qwen2ForCausalLM(cfg)
        with torch.no_grad():  # random init leaves biases at zero: make them matter
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                             layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    elif arch == "mistral":
        cfg = tf.MistralConfig(**common, tie_word_embeddings=False, sliding_window=40)
        model = tf.MistralForCausalLM(cfg)
    else:
        raise ValueError(arch)
    with torch.no_grad():  # larger weights than the 0.02 init so logits are not all alike
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
    model.save_pretrained(path)
    return path


def load_oracle(path: Path):
    """transformers' own model over the same weights, float32, eager-free SDPA, eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()
