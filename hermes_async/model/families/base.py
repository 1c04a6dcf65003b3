"""What a model family is: its architectures, the :class:`~hermes_async.model.spec.ModelSpec`
options it sets from its config, and its checkpoint's tensor names.

A family file states only how it differs from Llama: ``options(cfg)`` returns the ModelSpec
fields it overrides (q/k norms, norm placement, multipliers, biases, windows, NoPE layers),
and ``names`` maps each of the decoder's weights to the checkpoint's tensor name (``None``:
the family has no such weight).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TensorNames:
    """Checkpoint tensor names; the layer ones are relative to ``layer`` (``{i}``: its
    index). ``input_norm`` and ``mlp_norm`` are the pre-norms (before attention, before the
    MLP), ``attn_out_norm`` and ``mlp_out_norm`` the post-norms of the blocks' outputs."""

    embed: str = "model.embed_tokens.weight"
    final_norm: str = "model.norm.weight"
    lm_head: str = "lm_head.weight"
    layer: str = "model.layers.{i}."
    input_norm: str | None = "input_layernorm.weight"
    mlp_norm: str | None = "post_attention_layernorm.weight"
    attn_out_norm: str | None = None
    mlp_out_norm: str | None = None
    q_norm: str = "self_attn.q_norm.weight"
    k_norm: str = "self_attn.k_norm.weight"
    attention: str = "self_attn.{name}_proj."  # name: q, k, v, o
    mlp: str = "mlp.{name}_proj."  # name: gate, up, down
    fused_qkv: str | None = None  # one q/k/v tensor in the checkpoint (Phi-3), relative
    fused_gate_up: str | None = None  # one gate/up tensor (Phi-3)
    router: str = "mlp.gate.weight"  # of a mixture-of-experts layer
    expert: str = "mlp.experts.{j}.{name}_proj.weight"  # expert j's; name: gate, up, down


def no_options(cfg: object) -> dict[str, object]:
    return {}


@dataclass(frozen=True)
class Family:
    """One family of decoders: its Hugging Face architecture names, the ModelSpec options its
    config sets, and its tensor names."""

    name: str
    architectures: tuple[str, ...]
    options: Callable[[object], dict[str, object]] = no_options
    names: TensorNames = field(default_factory=TensorNames)
    # added to every RMSNorm weight at load: 1.0 where the checkpoint stores w of (1 + w)
    norm_weight_offset: float = 0.0
    # a multimodal wrapper: the decoder's config is ``text_config`` (its names: ``names``)
    text_config: bool = False
