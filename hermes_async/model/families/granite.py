"""Granite 3.x: Llama with an embedding multiplier, a residual multiplier on each block's
output, ``attention_multiplier`` as the softmax scale and logits divided by
``logits_scaling``."""

from hermes_async.model.families.base import Family, GGUFFacts, GGUFLayout


def options(cfg: object) -> dict[str, object]:
    return {"embedding_scale": float(cfg.embedding_multiplier),  # type: ignore[attr-defined]
            "residual_scale": float(cfg.residual_multiplier),  # type: ignore[attr-defined]
            "attention_scale": float(cfg.attention_multiplier),  # type: ignore[attr-defined]
            "logit_scale": 1.0 / float(cfg.logits_scaling)}  # type: ignore[attr-defined]


def gguf_config(facts: GGUFFacts) -> dict[str, object]:
    """llama.cpp's names for the four multipliers."""
    return {"embedding_multiplier": facts.float("embedding_scale", 1.0),
            "residual_multiplier": facts.float("residual_scale", 1.0),
            "attention_multiplier": facts.float("attention.scale", 1.0),
            "logits_scaling": facts.float("logit_scale", 1.0)}


FAMILY = Family("granite", ("GraniteForCausalLM",), options,
                gguf=GGUFLayout("granite", "granite", permute_qk=True, config=gguf_config))
