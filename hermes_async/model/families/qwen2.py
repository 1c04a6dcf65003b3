"""Qwen2 / Qwen2.5: Llama with q/k/v biases (no o bias) and windows on the layers whose
``layer_types`` say so."""

from hermes_async.model.families.base import Family, GGUFLayout
from hermes_async.model.spec import windows_from_layer_types


def options(cfg: object) -> dict[str, object]:
    return {"qkv_bias": True, "o_bias": False, "sliding_windows": windows_from_layer_types(cfg)}


FAMILY = Family("qwen2", ("Qwen2ForCausalLM",), options, gguf=GGUFLayout("qwen2", "qwen2"))
