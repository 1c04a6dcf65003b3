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


ARCHS = ("llama", "qwen2", "mistral", "qwen3", "granite", "olmo2", "smollm3", "seed_oss",
         "gemma3", "qwen3_moe", "phi3", "gemma3_mm", "gemma2")
WINDOWED_ARCHS = ("mistral", "gemma3", "gemma3_mm", "gemma2")  # with sliding-window layers
SOFTCAP_ARCHS = ("gemma2",)  # soft-capped attention: the torch backend only


# what llama.cpp's GGUF cannot state, made to follow its fixed rules in the GGUF variants
# (``make_tiny_model(..., gguf_layout=True)``): SmolLM3 leaves RoPE out of every 4th layer,
# Qwen3-MoE has no dense layers, Mistral ("llama" in GGUF) no window
GGUF_ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe", "gemma3", "phi3", "granite", "olmo2",
              "smollm3", "seed_oss", "gemma2")


def _family_model(arch: str, common: dict, gguf_layout: bool = False):
    """The tiny config and transformers model of the newer families (random init)."""
    import transformers as tf

    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if arch == "qwen3":
        cfg = tf.Qwen3Config(**common, tie_word_embeddings=False, rope_parameters=rope)
        return tf.Qwen3ForCausalLM(cfg)
    if arch == "granite":
        cfg = tf.GraniteConfig(**common, tie_word_embeddings=True, embedding_multiplier=3.0,
                               residual_multiplier=0.5, attention_multiplier=0.1,
                               logits_scaling=4.0, rope_parameters=rope)
        return tf.GraniteForCausalLM(cfg)
    if arch == "olmo2":
        cfg = tf.Olmo2Config(**common, tie_word_embeddings=False, rope_parameters=rope)
        return tf.Olmo2ForCausalLM(cfg)
    if arch == "smollm3" and gguf_layout:
        cfg = tf.SmolLM3Config(**{**common, "num_hidden_layers": 4}, tie_word_embeddings=True,
                               no_rope_layers=[1, 1, 1, 0], rope_parameters=rope)
        return tf.SmolLM3ForCausalLM(cfg)
    if arch == "smollm3":
        cfg = tf.SmolLM3Config(**common, tie_word_embeddings=True, no_rope_layers=[1, 0, 1],
                               rope_parameters=rope)
        return tf.SmolLM3ForCausalLM(cfg)
    if arch == "seed_oss":
        cfg = tf.SeedOssConfig(**common, tie_word_embeddings=False, attention_bias=True,
                               attention_out_bias=False, rope_parameters=rope)
        return tf.SeedOssForCausalLM(cfg)
    if arch == "phi3":  # no window: the kernel backends run it too
        cfg = tf.Phi3Config(**common, tie_word_embeddings=False, sliding_window=None,
                            rope_parameters=rope)
        return tf.Phi3ForCausalLM(cfg)
    if arch == "qwen3_moe":  # 8 experts, top 2; layer 1 dense
        cfg = tf.Qwen3MoeConfig(**{"moe_intermediate_size": 48, **common},
                                tie_word_embeddings=False, rope_parameters=rope,
                                num_experts=8, num_experts_per_tok=2,
                                decoder_sparse_step=1, norm_topk_prob=True,
                                mlp_only_layers=[] if gguf_layout else [1])
        return tf.Qwen3MoeForCausalLM(cfg)
    if arch == "gemma3_mm":  # the image-text wrapper with a one-layer vision tower
        text = dict(common, sliding_window=40, query_pre_attn_scalar=24,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"])
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, image_size=28, patch_size=14)
        cfg = tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
        return tf.Gemma3ForConditionalGeneration(cfg)
    if arch == "gemma2":  # caps low enough to bite on these random weights
        cfg = tf.Gemma2Config(**common, tie_word_embeddings=True, sliding_window=40,
                              query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                              final_logit_softcapping=5.0, rope_parameters=rope,
                              layer_types=["sliding_attention", "full_attention",
                                           "sliding_attention"])
        return tf.Gemma2ForCausalLM(cfg)
    if arch == "gemma3":
        cfg = tf.Gemma3TextConfig(
            **common, tie_word_embeddings=True, sliding_window=40, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                             "full_attention": {"rope_type": "default", "rope_theta": 1e6}})
        cfg.architectures = ["Gemma3ForCausalLM"]
        return tf.Gemma3ForCausalLM(cfg)
    raise ValueError(arch)


def make_tiny_model(path: Path, arch: str = "llama", seed: int = 0,
                    head_dim: int = 16, vocab_size: int | None = None,
                    gguf_layout: bool = False, sizes: dict | None = None) -> Path:
    """Write a random tiny ``arch`` (one of :data:`ARCHS`) checkpoint to ``path``
    (``head_dim`` 32 or more for the kernel backends, which take no smaller heads). Every
    weight is random, 1-D ones too (norm weights around 1, biases around 0), so that a norm
    applied as ``w`` instead of ``1 + w`` or in the wrong place changes the logits."""
    import transformers as tf

    torch.manual_seed(seed)
    common = {**COMMON, "head_dim": head_dim, **(sizes or {})}
    if vocab_size is not None:  # a real tokenizer's (the served tests)
        common["vocab_size"] = vocab_size
    if arch not in ("llama", "qwen2", "mistral"):
        model = _family_model(arch, common, gguf_layout)
    elif arch == "llama":
        cfg = tf.LlamaConfig(**common, tie_word_embeddings=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        model = tf.LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(**common, tie_word_embeddings=False)
        model = tf.Qwen2ForCausalLM(cfg)
    elif arch == "mistral":
        cfg = tf.MistralConfig(**common, tie_word_embeddings=False,
                               sliding_window=None if gguf_layout else 40)
        model = tf.MistralForCausalLM(cfg)
    with torch.no_grad():  # larger weights than the 0.02 init so logits are not all alike
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # matrices, and stacked experts
                p.normal_(0, 0.15)
            elif "norm" in name:  # Gemma's (1 + w): w itself around 0
                p.uniform_(-0.5, 0.5) if arch.startswith("gemma") else p.uniform_(0.5, 1.5)
            else:  # biases
                p.normal_(0, 0.5)
    model.save_pretrained(path)
    return path


def load_oracle(path: Path):
    """transformers' own model over the same weights, float32, eager-free SDPA, eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tiny_tokenizer(path: Path, vocab_size: int = 320) -> Path:
    """A byte-level BPE of ``vocab_size`` tokens (ids 0-2: ``<|endoftext|>``, ``<|im_start|>``,
    ``<|im_end|>``) trained on a few sentences, with a ChatML template: the tiny models'
    vocabulary, for tests that need a tokenizer (GGUF files carry one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    text = ["The sea is wide and the ships sail on it.", "Tell me about the sea, please.",
            "Numbers like 12345 and 3.50 appear in text.", "hello world, hello there"] * 4
    tok.train_from_iterator(text, trainer)
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = TINY_CHAT_TEMPLATE
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(path))
    return path
