"""Phi-3 / Phi-4 (``Phi3ForCausalLM``): Llama with q/k/v and gate/up fused in the checkpoint
(``qkv_proj``, ``gate_up_proj``: loaded as they are) and ``sliding_window`` on every layer
where the config sets one. Not yet: ``longrope`` (it switches to the long factors past the
original length) and partial rotary: refused by name at load."""

from hermes_async.model.families.base import Family, GGUFLayout, TensorNames
from hermes_async.model.spec import ModelLoadError


def options(cfg: object) -> dict[str, object]:
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    if params.get("rope_type") == "longrope":
        raise ModelLoadError("Phi3ForCausalLM: longrope scaling is not supported yet")
    window = getattr(cfg, "sliding_window", None)
    return {"sliding_windows": (window,) * cfg.num_hidden_layers}  # type: ignore[attr-defined]


FAMILY = Family("phi3", ("Phi3ForCausalLM",), options,
                TensorNames(fused_qkv="self_attn.qkv_proj.weight",
                            fused_gate_up="mlp.gate_up_proj.weight"),
                gguf=GGUFLayout("phi3", "phi3"))
