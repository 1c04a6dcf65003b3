"""What the runner needs to know of a decoder model, read from its Hugging Face config.

transformers parses ``config.json`` (and computes RoPE inverse frequencies for every scaling
type it knows); this module finds the architecture's family (:mod:`hermes_async.model.families`:
one file each, stating only how it differs from Llama) and flattens what the forward uses into
a frozen :class:`ModelSpec`: the shapes, and the options the families differ by (q/k norms,
norm placement, embedding / residual / logit multipliers, attention scale, per-layer windows
and RoPE tables, NoPE layers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch


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
    # options a family sets (defaults: Llama)
    qk_norm: str = "none"  # "head": RMSNorm over each head's d (Qwen3); "full": over all heads
    pre_norms: bool = True  # RMSNorm before attention and before the MLP
    post_norms: bool = False  # RMSNorm of the attention and MLP outputs (OLMo 2, Gemma)
    activation: str = "silu"  # of the gated MLP: "silu" or "gelu_tanh"
    embedding_scale: float = 1.0  # embeddings multiplied by (Granite, Gemma)
    residual_scale: float = 1.0  # each block's output multiplied by before the add (Granite)
    attention_scale: float | None = None  # None: head_dim ** -0.5
    logit_scale: float = 1.0  # logits multiplied by (Granite: 1 / logits_scaling)
    rope_layers: tuple[bool, ...] = ()  # per layer: RoPE on (empty: every layer); SmolLM3 NoPE
    # more RoPE tables (inv_freq, attention scaling) after the first (``inv_freq``), and each
    # layer's table index (empty: table 0 everywhere); Gemma 3: local and global bases
    extra_rope_tables: tuple[tuple[torch.Tensor, float], ...] = ()
    layer_rope_tables: tuple[int, ...] = ()
    # Phi-3 longrope: positions from this one on rotate with table 1 (the long factors), the
    # earlier ones with table 0 (short); a key keeps the rotation it was written with
    rope_switch_position: int | None = None
    # mixture of experts (Qwen3-MoE): per layer whether its MLP is the sparse block
    moe_layers: tuple[bool, ...] = ()
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    # soft-capping (Gemma 2): attention scores and final logits as cap * tanh(x / cap)
    attn_softcap: float | None = None
    final_softcap: float | None = None

    @property
    def scale(self) -> float:
        """The attention's softmax scale."""
        return self.head_dim ** -0.5 if self.attention_scale is None else self.attention_scale

    def is_moe(self, layer: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[layer]

    def uses_rope(self, layer: int) -> bool:
        return not self.rope_layers or self.rope_layers[layer]

    @property
    def rope_tables(self) -> tuple[tuple[torch.Tensor, float], ...]:
        """Every RoPE table: ``(inv_freq, attention scaling)``, the first one's own first."""
        return ((self.inv_freq, self.rope_attention_scaling), *self.extra_rope_tables)

    @property
    def rotary_dim(self) -> int:
        """Each head's dimensions RoPE rotates (its first ones, in the neox halves): the head
        size, less with partial rotary (the others pass through unrotated)."""
        return 2 * self.inv_freq.numel()

    def rope_table(self, layer: int) -> int:
        """The index in :attr:`rope_tables` of ``layer``'s table."""
        return self.layer_rope_tables[layer] if self.layer_rope_tables else 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def read_spec(model_dir: Path) -> ModelSpec:
    """Parse ``model_dir/config.json`` with transformers into a :class:`ModelSpec`."""
    from hermes_async.model.families import family_for, supported_architectures

    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"missing {config_path}: not a Hugging Face model directory")
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {config_path}: {e}") from e
    archs = raw.get("architectures") or []
    family = next((f for a in archs if (f := family_for(a)) is not None), None)
    if family is None:
        raise ModelLoadError(
            f"unsupported architecture {archs or raw.get('model_type')!r} in {config_path}; "
            f"hermes_async runs {', '.join(supported_architectures())}"
        )
    arch = next(a for a in archs if family_for(a) is family)
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as e:  # transformers raises many types for a bad config
        raise ModelLoadError(f"transformers cannot parse {config_path}: {e}") from e
    if family.text_config:  # a multimodal wrapper: its language model's part
        cfg = cfg.text_config
    act_name = (getattr(cfg, "hidden_act", None) or getattr(cfg, "hidden_activation", None)
                or "silu")
    activation = ACTIVATIONS.get(act_name)
    if activation is None:
        raise ModelLoadError(f"{arch}: hidden_act {act_name!r} unsupported "
                             f"(one of {', '.join(ACTIVATIONS)})")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inv_freq, scaling = _rope(cfg, arch)
    attention_bias = bool(getattr(cfg, "attention_bias", False))
    fields = dict(
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
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
        sliding_windows=(None,) * cfg.num_hidden_layers,
        inv_freq=inv_freq,
        rope_attention_scaling=float(scaling),
        activation=activation,
    )
    fields.update(family.options(cfg))
    return ModelSpec(**fields)  # type: ignore[arg-type]


# the gated MLP's activation, by the names transformers' configs use
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def windows_from_layer_types(cfg: object) -> tuple[int | None, ...]:
    """Per-layer windows from ``layer_types`` (``sliding_attention`` layers get
    ``sliding_window``), as Qwen2/Qwen3/SmolLM3/Gemma configs state them."""
    n = cfg.num_hidden_layers  # type: ignore[attr-defined]
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if not (layer_types and window):
        return (None,) * n
    return tuple(window if t == "sliding_attention" else None for t in layer_types)


def rope_for_layer_type(cfg: object, layer_type: str) -> tuple[torch.Tensor, float]:
    """The RoPE table of one layer type where ``rope_parameters`` is keyed by layer type
    (Gemma 3: ``full_attention`` and ``sliding_attention`` with their own bases)."""
    params = cfg.rope_parameters[layer_type]  # type: ignore[attr-defined]
    return _rope_table(cfg, params, f"{layer_type} layers", layer_type)


def rotary_dim(cfg: object, params: dict | None = None) -> int:
    """How many of each head's dimensions RoPE rotates: ``head_dim`` times
    ``partial_rotary_factor`` (Phi-4-mini: 0.75, the rest pass through), as transformers'
    RoPE functions compute it."""
    head_dim = (getattr(cfg, "head_dim", None)
                or cfg.hidden_size // cfg.num_attention_heads)  # type: ignore[attr-defined]
    factor = (params or {}).get("partial_rotary_factor",
                                getattr(cfg, "partial_rotary_factor", None) or 1.0)
    return int(head_dim * factor)


def _rope(cfg: object, arch: str) -> tuple[torch.Tensor, float]:
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    if "full_attention" in params:  # keyed by layer type: the family reads the others
        return rope_for_layer_type(cfg, "full_attention")
    return _rope_table(cfg, params, arch)


def _rope_table(cfg: object, params: dict, what: str,
                layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """``(inv_freq, attention scaling)`` of one set of RoPE parameters: the default formula,
    else transformers' RoPE functions (llama3, yarn, linear, ...; per layer type where the
    config keys them so)."""
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        dim = rotary_dim(cfg, params)
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        return inv, 1.0
    if rope_type == "dynamic":
        raise ModelLoadError(f"{what}: dynamic NTK rope scaling is not supported")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ModelLoadError(f"{what}: unknown rope_type {rope_type!r}")
    extra = {} if layer_type is None else {"layer_type": layer_type}
    inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, torch.device("cpu"), **extra)
    return inv.float(), float(scaling)
