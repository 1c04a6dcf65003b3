"""Gemma 2 (``Gemma2ForCausalLM``): Gemma 3's sandwich norms, ``(1 + w)`` RMSNorm, GELU-tanh
MLP, scaled embeddings and ``query_pre_attn_scalar``, without q/k norms and with one RoPE base,
local and global layers alternating (``layer_types``), and soft-capping of the attention
scores (``attn_logit_softcapping``) and of the final logits (``final_logit_softcapping``).
The fast CPU kernels have no soft-capping: ``auto`` serves it on the ``torch`` backend."""

from hermes_async.model.families.base import Family, GGUFFacts, GGUFLayout
from hermes_async.model.families.gemma3 import NAMES, gguf_query_scalar
from hermes_async.model.spec import windows_from_layer_types


def options(cfg: object) -> dict[str, object]:
    attn = getattr(cfg, "attn_logit_softcapping", None)
    final = getattr(cfg, "final_logit_softcapping", None)
    return {
        "post_norms": True,
        "embedding_scale": float(cfg.hidden_size) ** 0.5,  # type: ignore[attr-defined]
        "attention_scale": float(cfg.query_pre_attn_scalar) ** -0.5,  # type: ignore[attr-defined]
        "sliding_windows": windows_from_layer_types(cfg),
        "attn_softcap": float(attn) if attn else None,
        "final_softcap": float(final) if final else None,
    }


def gguf_config(facts: GGUFFacts) -> dict[str, object]:
    """llama.cpp's Gemma 2: even layers local, ``attention.scale`` where stated (else
    head_dim), the two soft-caps under their own keys."""
    n = int(facts.get("block_count", 0))
    hidden, heads = int(facts.get("embedding_length")), int(facts.get("attention.head_count"))
    head_dim = int(facts.get("attention.key_length", hidden // heads))
    return {
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                        for i in range(n)],
        "query_pre_attn_scalar": gguf_query_scalar(facts, head_dim),
        "attn_logit_softcapping": facts.float("attn_logit_softcapping", 50.0),
        "final_logit_softcapping": facts.float("final_logit_softcapping", 30.0),
        "hidden_activation": "gelu_pytorch_tanh",
    }


FAMILY = Family("gemma2", ("Gemma2ForCausalLM",), options, NAMES, norm_weight_offset=1.0,
                gguf=GGUFLayout("gemma2", "gemma2", config=gguf_config))
