"""ByteDance Seed-OSS (and Hermes 4.3): Llama with q/k/v biases (``attention_bias``) and the
o projection's own (``attention_out_bias``)."""

from hermes_async.model.families.base import Family, GGUFFacts, GGUFLayout


def options(cfg: object) -> dict[str, object]:
    return {"qkv_bias": bool(getattr(cfg, "attention_bias", False)),
            "o_bias": bool(getattr(cfg, "attention_out_bias", False))}


def gguf_config(facts: GGUFFacts) -> dict[str, object]:
    return {"attention_out_bias": "blk.0.attn_output.bias" in facts.tensors}


FAMILY = Family("seed_oss", ("SeedOssForCausalLM",), options,
                gguf=GGUFLayout("seed_oss", "seed_oss", config=gguf_config))
