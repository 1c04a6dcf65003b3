"""What the runner needs to know of a Llama-family model, read from its Hugging Face config.

transformers parses ``config.json`` (and computes RoPE inverse frequencies for every scaling
type it knows); this module checks the architecture is one the runner implements and flattens
the parts it uses into a frozen :class:`ModelSpec`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


class ModelLoadError(RuntimeError):
    """The model directory cannot be served: names the file or the architecture at fault."""


@dataclass(frozen=True)
class ModelSpec:
    """Shape and options of a Llama-family decoder."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    sliding_windows: tuple[int | None, ...]  # per layer; None = full attention
    inv_freq: torch.Tensor
    rope_attention_scaling: float

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def read_spec(model_dir: Path) -> ModelSpec:
    """Parse ``model_dir/config.json`` with transformers into a :class:`ModelSpec`."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"missing {config_path}: not a Hugging Face model directory")
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {config_path}: {e}") from e
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ModelLoadError(
            f"unsupported architecture {archs or raw.get('model_type')!r} in {config_path}; "
            f"hermes_async runs {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as e:  # transformers raises many types for a bad config
        raise ModelLoadError(f"transformers cannot parse {config_path}: {e}") from e
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{arch}: hidden_act {cfg.hidden_act!r} unsupported (silu only)")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inv_freq, scaling = _rope(cfg, arch)
    family = SUPPORTED_ARCHITECTURES[arch]
    attention_bias = bool(getattr(cfg, "attention_bias", False))
    return ModelSpec(
        architecture=arch,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        head_dim=head_dim,
        rms_norm_eps=float(cfg.rms_norm_eps),
        max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 2048)),
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        qkv_bias=True if family == "qwen2" else attention_bias,
        o_bias=False if family == "qwen2" else attention_bias,
        mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
        sliding_windows=_sliding_windows(cfg, family),
        inv_freq=inv_freq,
        rope_attention_scaling=float(scaling),
    )


def _rope(cfg: object, arch: str) -> tuple[torch.Tensor, float]:
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        partial = params.get("partial_rotary_factor", 1.0)
        if partial != 1.0:
            raise ModelLoadError(f"{arch}: partial rotary embeddings are not supported")
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        return inv, 1.0
    if rope_type == "dynamic":
        raise ModelLoadError(f"{arch}: dynamic NTK rope scaling is not supported")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ModelLoadError(f"{arch}: unknown rope_type {rope_type!r}")
    inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, torch.device("cpu"))
    return inv.float(), float(scaling)


def _sliding_windows(cfg: object, family: str) -> tuple[int | None, ...]:
    """Per-layer attention window: Mistral applies ``sliding_window`` everywhere, Qwen2 only on
    layers whose ``layer_types`` entry says so, Llama never."""
    n = cfg.num_hidden_layers
    window = getattr(cfg, "sliding_window", None)
    if family == "mistral":
        return (window,) * n
    layer_types = getattr(cfg, "layer_types", None)
    if family == "qwen2" and layer_types and window:
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    return (None,) * n
