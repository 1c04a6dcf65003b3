"""Gemma 3 (``Gemma3ForCausalLM``; the text part of ``Gemma3ForConditionalGeneration``).

RMSNorm as ``(1 + w)`` (folded into the weights at load), pre- and post-norms around attention
and the MLP (sandwich), q/k RMSNorm per head, a GELU-tanh gated MLP, embeddings scaled by
``sqrt(hidden_size)``, ``query_pre_attn_scalar ** -0.5`` as the softmax scale, and local
(sliding) layers with their own RoPE base beside the global ones."""

import dataclasses

from hermes_async.model.families.base import Family, GGUFFacts, GGUFLayout, TensorNames
from hermes_async.model.spec import ModelLoadError, rope_for_layer_type, windows_from_layer_types


def options(cfg: object) -> dict[str, object]:
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "attn_logit_softcapping",
                                                                None):
        raise ModelLoadError("gemma3: logit soft-capping is not supported")
    types = list(cfg.layer_types)  # type: ignore[attr-defined]
    sliding = rope_for_layer_type(cfg, "sliding_attention")
    return {
        "qk_norm": "head", "post_norms": True,
        "embedding_scale": float(cfg.hidden_size) ** 0.5,  # type: ignore[attr-defined]
        "attention_scale": float(cfg.query_pre_attn_scalar) ** -0.5,  # type: ignore[attr-defined]
        "sliding_windows": windows_from_layer_types(cfg),
        "extra_rope_tables": (sliding,),
        "layer_rope_tables": tuple(1 if t == "sliding_attention" else 0 for t in types),
    }


# llama.cpp's Gemma 3: five local layers then a global one unless the file states a pattern,
# local layers' RoPE base 10 000 unless stated; queries scaled by ``attention.scale`` where
# stated, else as llama.cpp does: 27B (62 layers) by hidden / heads, the others by head_dim
GGUF_WINDOW_PERIOD = 6
GGUF_LOCAL_ROPE_BASE = 10000.0


def gguf_query_scalar(facts: GGUFFacts, default: int) -> int:
    """``query_pre_attn_scalar`` from ``attention.scale`` where the file states it."""
    scale = facts.get("attention.scale")
    return round(facts.float("attention.scale", 0.0) ** -2) if scale else default


def gguf_config(facts: GGUFFacts) -> dict[str, object]:
    n = int(facts.get("block_count", 0))
    pattern = facts.get("attention.sliding_window_pattern", GGUF_WINDOW_PERIOD)
    if isinstance(pattern, list):
        local = [bool(p) for p in pattern]
    else:
        local = [(i + 1) % int(pattern) != 0 for i in range(n)]
    hidden, heads = int(facts.get("embedding_length")), int(facts.get("attention.head_count"))
    head_dim = int(facts.get("attention.key_length", hidden // heads))
    full = {"rope_type": "default", "rope_theta": float(facts.get("rope.freq_base", 1e6))}
    factor = facts.get("rope.scaling.factor")
    if facts.get("rope.scaling.type") == "linear" and factor:
        full.update(rope_type="linear", factor=float(factor))
    return {
        "layer_types": ["sliding_attention" if x else "full_attention" for x in local],
        "rope_parameters": {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": float(
                facts.get("rope.freq_base_swa", GGUF_LOCAL_ROPE_BASE))}},
        "query_pre_attn_scalar": gguf_query_scalar(facts,
                                                   hidden // heads if n == 62 else head_dim),
        "hidden_activation": "gelu_pytorch_tanh",
    }


NAMES = TensorNames(mlp_norm="pre_feedforward_layernorm.weight",
                    attn_out_norm="post_attention_layernorm.weight",
                    mlp_out_norm="post_feedforward_layernorm.weight")
FAMILY = Family("gemma3", ("Gemma3ForCausalLM",), options, NAMES, norm_weight_offset=1.0,
                gguf=GGUFLayout("gemma3", "gemma3_text", config=gguf_config))
# Gemma 3 4B and larger: the image-text checkpoint; its text part is served (the vision
# tower's tensors are not read), the decoder's tensors under ``language_model.``
MULTIMODAL = Family("gemma3", ("Gemma3ForConditionalGeneration",), options,
                    dataclasses.replace(NAMES, embed="language_model.model.embed_tokens.weight",
                                        final_norm="language_model.model.norm.weight",
                                        lm_head="language_model.lm_head.weight",
                                        layer="language_model.model.layers.{i}."),
                    norm_weight_offset=1.0, text_config=True)
