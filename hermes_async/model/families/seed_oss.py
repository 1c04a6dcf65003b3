"""ByteDance Seed-OSS (and Hermes 4.3): Llama with q/k/v biases (``attention_bias``) and the
o projection's own (``attention_out_bias``)."""

from hermes_async.model.families.base import Family


def options(cfg: object) -> dict[str, object]:
    return {"qkv_bias": bool(getattr(cfg, "attention_bias", False)),
            "o_bias": bool(getattr(cfg, "attention_out_bias", False))}


FAMILY = Family("seed_oss", ("SeedOssForCausalLM",), options)
