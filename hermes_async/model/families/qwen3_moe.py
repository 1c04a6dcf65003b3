"""Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): Qwen3 whose MLPs are mixture-of-experts blocks
(``num_experts``, top ``num_experts_per_tok`` renormalised when ``norm_topk_prob``) on every
``decoder_sparse_step``-th layer not in ``mlp_only_layers``; no shared experts."""

from hermes_async.model.families import qwen3
from hermes_async.model.families.base import Family, GGUFFacts, GGUFLayout


def options(cfg: object) -> dict[str, object]:
    n = cfg.num_hidden_layers  # type: ignore[attr-defined]
    experts = int(getattr(cfg, "num_experts", 0) or 0)
    step = int(getattr(cfg, "decoder_sparse_step", 1) or 1)
    dense = set(getattr(cfg, "mlp_only_layers", None) or [])
    return {**qwen3.options(cfg),
            "moe_layers": tuple(experts > 0 and i not in dense and (i + 1) % step == 0
                                for i in range(n)),
            "num_experts": experts,
            "experts_per_token": int(cfg.num_experts_per_tok),  # type: ignore[attr-defined]
            "moe_intermediate_size": int(cfg.moe_intermediate_size),  # type: ignore[attr-defined]
            "norm_topk_prob": bool(getattr(cfg, "norm_topk_prob", False))}


def gguf_config(facts: GGUFFacts) -> dict[str, object]:
    """Experts from llama.cpp's keys; the dense layers are those without a router tensor."""
    n = int(facts.get("block_count", 0))
    routed = set(facts.layers_with("ffn_gate_inp.weight"))
    return {"num_experts": int(facts.get("expert_count", 0)),
            "num_experts_per_tok": int(facts.get("expert_used_count", 0)),
            "moe_intermediate_size": int(facts.get("expert_feed_forward_length", 0)),
            "norm_topk_prob": bool(facts.get("expert_weights_norm", True)),
            "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i in range(n) if i not in routed]}


FAMILY = Family("qwen3_moe", ("Qwen3MoeForCausalLM",), options,
                gguf=GGUFLayout("qwen3moe", "qwen3_moe", config=gguf_config))
