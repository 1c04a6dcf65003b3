"""Phi-3 / Phi-4 (``Phi3ForCausalLM``): Llama with q/k/v and gate/up fused in the checkpoint
(``qkv_proj``, ``gate_up_proj``: loaded as they are), ``sliding_window`` on every layer where
the config sets one, and ``longrope`` (Phi-3-mini-128k, Phi-3.5): short factors up to
``original_max_position_embeddings``, long factors from there on. As transformers does while it
generates, a token rotates by its own position: positions past the original length use the
long factors, earlier keys keep the short rotation they were written with (a prompt longer than
the original length, in one forward, uses the long factors for all its tokens in transformers:
there only the tokens past it differ). Partial rotary (Phi-4-mini: ``partial_rotary_factor``
0.75) rotates the first part of each head only, with factors for that part."""

import torch

from hermes_async.model.families.base import Family, GGUFLayout, TensorNames
from hermes_async.model.spec import ModelLoadError, rotary_dim


def _longrope(cfg: object, params: dict) -> dict[str, object]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rotated = rotary_dim(cfg, params)
    original = int(params.get("original_max_position_embeddings")
                   or getattr(cfg, "original_max_position_embeddings", None)
                   or cfg.max_position_embeddings)  # type: ignore[attr-defined]
    init = ROPE_INIT_FUNCTIONS["longrope"]
    short, scaling = init(cfg, torch.device("cpu"))
    long, long_scaling = init(cfg, torch.device("cpu"), seq_len=original + 1)
    if short.numel() != rotated // 2:
        raise ModelLoadError("Phi3ForCausalLM: longrope factors do not cover the rotary size")
    return {"inv_freq": short.float(), "rope_attention_scaling": float(scaling),
            "extra_rope_tables": ((long.float(), float(long_scaling)),),
            "rope_switch_position": original}


def options(cfg: object) -> dict[str, object]:
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    window = getattr(cfg, "sliding_window", None)
    out: dict[str, object] = {
        "sliding_windows": (window,) * cfg.num_hidden_layers}  # type: ignore[attr-defined]
    if params.get("rope_type") == "longrope":
        out.update(_longrope(cfg, params))
    return out


FAMILY = Family("phi3", ("Phi3ForCausalLM",), options,
                TensorNames(fused_qkv="self_attn.qkv_proj.weight",
                            fused_gate_up="mlp.gate_up_proj.weight"),
                gguf=GGUFLayout("phi3", "phi3"))
