"""Qwen3 (and Hermes 4 14B): Llama with an RMSNorm over each head's q and k before RoPE,
biases only where ``attention_bias``, windows by ``layer_types``."""

from hermes_async.model.families.base import Family, GGUFLayout
from hermes_async.model.spec import windows_from_layer_types


def options(cfg: object) -> dict[str, object]:
    return {"qk_norm": "head", "sliding_windows": windows_from_layer_types(cfg)}


FAMILY = Family("qwen3", ("Qwen3ForCausalLM",), options, gguf=GGUFLayout("qwen3", "qwen3"))
