"""Granite 3.x: Llama with an embedding multiplier, a residual multiplier on each block's
output, ``attention_multiplier`` as the softmax scale and logits divided by
``logits_scaling``."""

from hermes_async.model.families.base import Family


def options(cfg: object) -> dict[str, object]:
    return {"embedding_scale": float(cfg.embedding_multiplier),  # type: ignore[attr-defined]
            "residual_scale": float(cfg.residual_multiplier),  # type: ignore[attr-defined]
            "attention_scale": float(cfg.attention_multiplier),  # type: ignore[attr-defined]
            "logit_scale": 1.0 / float(cfg.logits_scaling)}  # type: ignore[attr-defined]


FAMILY = Family("granite", ("GraniteForCausalLM",), options)
