"""OLMo 2: no pre-norms; RMSNorm of the attention and MLP outputs before each residual add
(``post_attention_layernorm``, ``post_feedforward_layernorm``); q and k normalised over all
heads at once (before RoPE)."""

from hermes_async.model.families.base import Family, GGUFLayout, TensorNames


def options(cfg: object) -> dict[str, object]:
    return {"qk_norm": "full", "pre_norms": False, "post_norms": True}


FAMILY = Family("olmo2", ("Olmo2ForCausalLM",), options,
                TensorNames(input_norm=None, mlp_norm=None,
                            attn_out_norm="post_attention_layernorm.weight",
                            mlp_out_norm="post_feedforward_layernorm.weight"),
                gguf=GGUFLayout("olmo2", "olmo2"))
