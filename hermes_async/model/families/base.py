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
from typing import Any


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
class GGUFFacts:
    """What a GGUF file states, for a family's :attr:`GGUFLayout.config`: its metadata
    (``values``, full keys) and each tensor's shape in PyTorch order (``tensors``)."""

    arch: str
    values: dict[str, Any]
    tensors: dict[str, tuple[int, ...]]

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``{arch}.key`` (``key`` without the architecture prefix)."""
        return self.values.get(f"{self.arch}.{key}", default)

    def float(self, key: str, default: float) -> float:
        """A float32 value of ``{arch}.key`` as the decimal it was written from (0.1, not
        0.10000000149)."""
        return float(f"{float(self.get(key, default)):.7g}")

    def layers_with(self, tensor: str) -> list[int]:
        """The blocks that hold ``blk.{i}.<tensor>``."""
        n = int(self.get("block_count", 0))
        return [i for i in range(n) if f"blk.{i}.{tensor}" in self.tensors]


def no_gguf_config(facts: GGUFFacts) -> dict[str, object]:
    return {}


@dataclass(frozen=True)
class GGUFLayout:
    """How llama.cpp writes a family's GGUF: its architecture name (``general.architecture``),
    the transformers ``model_type`` it reads back as, whether the converter permuted q/k
    (llama.cpp's ``LlamaModel`` subclasses: the interleaved RoPE layout), and ``config``: the
    config fields beyond the ones every family has (multipliers, experts, window patterns)."""

    arch: str
    model_type: str
    permute_qk: bool = False
    config: Callable[[GGUFFacts], dict[str, object]] = no_gguf_config


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
    # how the family's GGUF files are laid out (None: not read from GGUF)
    gguf: GGUFLayout | None = None
