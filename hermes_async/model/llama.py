"""The decoder over the paged KV pool: Llama and the families that differ from it by options
of :class:`~hermes_async.model.spec.ModelSpec` (:mod:`hermes_async.model.families`).

Weights are fused where one matmul can replace several (q/k/v, gate/up). The forward pass takes
one packed step (attention through the step's :class:`~hermes_async.model.attention.AttentionPlan`)
and returns logits only for the rows asked for: the last new token of each sequence. The
options: q/k RMSNorm per head or over all heads (before RoPE), pre-norms and/or post-norms of
the block outputs, the gated MLP's activation, embedding / residual / logit multipliers, the
attention scale, per-layer windows and NoPE layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hermes_async.model.attention import AttentionPlan
from hermes_async.model.kv_pool import KVPool
from hermes_async.model.layer_ops import TorchLayerOps
from hermes_async.model.moe import moe_mlp
from hermes_async.model.quant.weights import QuantizedWeight
from hermes_async.model.spec import ModelSpec

if TYPE_CHECKING:
    from hermes_async.model.quant.apply import QuantReport


class DecoderLayer(nn.Module):
    """One attention + gated MLP block; the norms the spec asks for (None where it has none)."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, moe: bool = False) -> None:
        super().__init__()
        h, qkv = spec.hidden_size, spec.q_size + 2 * spec.kv_size

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        def maybe(on: bool, *shape: int) -> nn.Parameter | None:
            return param(*shape) if on else None

        self.input_norm = maybe(spec.pre_norms, h)
        self.mlp_norm = maybe(spec.pre_norms, h)
        self.attn_out_norm = maybe(spec.post_norms, h)
        self.mlp_out_norm = maybe(spec.post_norms, h)
        per_head = spec.qk_norm == "head"
        self.q_norm = maybe(spec.qk_norm != "none", spec.head_dim if per_head else spec.q_size)
        self.k_norm = maybe(spec.qk_norm != "none", spec.head_dim if per_head else spec.kv_size)
        self.qkv_weight = param(qkv, h)
        self.qkv_bias = maybe(spec.qkv_bias, qkv)
        self.o_weight = param(h, spec.q_size)
        self.o_bias = maybe(spec.o_bias, h)
        dense = not moe
        self.gate_up_weight = maybe(dense, 2 * spec.intermediate_size, h)
        self.gate_up_bias = maybe(dense and spec.mlp_bias, 2 * spec.intermediate_size)
        self.down_weight = maybe(dense, h, spec.intermediate_size)
        self.down_bias = maybe(dense and spec.mlp_bias, h)
        e, i = spec.num_experts, spec.moe_intermediate_size
        self.router_weight = maybe(moe, e, h)
        self.experts_gate_up = maybe(moe, e, h, 2 * i)  # stacked, x @ W layout
        self.experts_down = maybe(moe, e, i, h)


class LlamaModel(nn.Module):
    """The decoder stack, embedding and LM head."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype) -> None:
        super().__init__()
        self.spec = spec
        # None where a GGUF's tied table is kept as its blocks (``quantized_head``)
        self.embed: nn.Parameter | None = nn.Parameter(
            torch.empty(spec.vocab_size, spec.hidden_size, dtype=dtype), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(spec, dtype, spec.is_moe(i))
                                    for i in range(spec.num_layers))
        self.final_norm = nn.Parameter(torch.empty(spec.hidden_size, dtype=dtype),
                                       requires_grad=False)
        self.lm_head = (
            None if spec.tie_word_embeddings
            else nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size, dtype=dtype),
                              requires_grad=False)
        )
        self.ops = TorchLayerOps(spec)  # the runner may swap in fused kernels
        # the LM head quantized (model.quantization); the embedding table stays as it is
        self.quantized_head: QuantizedWeight | None = None
        self.quant_report: QuantReport | None = None  # the loader's, for GGUF blocks kept
        # an untied token table kept as a GGUF's blocks (``embed`` is then None)
        self.quantized_embed: QuantizedWeight | None = None

    def _qk_norms(self, layer: DecoderLayer, q: torch.Tensor,
                  k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[t, q_size]`` and k ``[t, kv_size]`` through the layer's q/k RMSNorms."""
        spec, ops, eps = self.spec, self.ops, self.spec.rms_norm_eps
        if layer.q_norm is None or layer.k_norm is None:
            return q, k
        if spec.qk_norm == "full":
            return ops.rms_norm(q, layer.q_norm, eps), ops.rms_norm(k, layer.k_norm, eps)
        d = spec.head_dim
        return (ops.rms_norm(q.reshape(-1, d), layer.q_norm, eps).view(q.shape),
                ops.rms_norm(k.reshape(-1, d), layer.k_norm, eps).view(k.shape))

    def _add(self, out: torch.Tensor, residual: torch.Tensor,
             norm: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual add of a block's output (scaled), and the next block's input: its
        pre-norm of the new residual where the spec has pre-norms, else the residual itself."""
        spec = self.spec
        if spec.residual_scale != 1.0:
            out = out * spec.residual_scale
        if norm is not None:
            return self.ops.add_rms_norm(out, residual, norm, spec.rms_norm_eps)
        residual = residual + out
        return residual, residual

    def _mlp(self, layer: DecoderLayer, h: torch.Tensor) -> torch.Tensor:
        ops = self.ops
        if layer.router_weight is not None:
            return moe_mlp(ops, h, layer.router_weight, layer.experts_gate_up,  # type: ignore[arg-type]
                           layer.experts_down, self.spec.experts_per_token,  # type: ignore[arg-type]
                           self.spec.norm_topk_prob)
        act = ops.act_mul(ops.linear(h, layer.gate_up_weight, layer.gate_up_bias))  # type: ignore[arg-type]
        return ops.linear(act, layer.down_weight, layer.down_bias)  # type: ignore[arg-type]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        plan: AttentionPlan,
        pool: KVPool,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Compute one packed step; return float32 logits ``[len(logits_indices), vocab]``."""
        spec, ops, eps = self.spec, self.ops, self.spec.rms_norm_eps
        t = input_ids.shape[0]
        if self.embed is None:  # a GGUF's table kept as its blocks (tied: the LM head's)
            table = self.quantized_embed or self.quantized_head
            assert table is not None
            residual = table.dequantize_rows(input_ids, self.final_norm.dtype)
        else:
            residual = ops.embedding(input_ids, self.embed)
        if spec.embedding_scale != 1.0:
            residual = residual * spec.embedding_scale
        scale = spec.scale
        split = [spec.q_size, spec.kv_size, spec.kv_size]
        rope = ops.rope(positions, residual.dtype)
        first = self.layers[0].input_norm
        h = residual if first is None else ops.rms_norm(residual, first, eps)
        for i, layer in enumerate(self.layers):
            q, k, v = ops.linear(h, layer.qkv_weight, layer.qkv_bias).split(split, dim=-1)
            q, k = self._qk_norms(layer, q, k)
            q = q.reshape(t, spec.num_heads, spec.head_dim)
            k = k.reshape(t, spec.num_kv_heads, spec.head_dim)
            if spec.uses_rope(i):
                q, k = ops.rotary(rope, q, k, spec.rope_table(i))
            v = v.reshape(t, spec.num_kv_heads, spec.head_dim)
            attn = plan.attend(pool.blocks(i), q, k, v, scale, spec.sliding_windows[i],
                               spec.attn_softcap)
            o = ops.linear(attn.reshape(t, spec.q_size), layer.o_weight, layer.o_bias)
            if layer.attn_out_norm is not None:
                o = ops.rms_norm(o, layer.attn_out_norm, eps)
            h, residual = self._add(o, residual, layer.mlp_norm)
            down = self._mlp(layer, h)
            if layer.mlp_out_norm is not None:
                down = ops.rms_norm(down, layer.mlp_out_norm, eps)
            nxt = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else None
            h, residual = self._add(down, residual, nxt)
        last = ops.rms_norm(residual[logits_indices], self.final_norm, eps)
        logits = ops.linear(last, self.head_weight).float()
        if spec.logit_scale != 1.0:
            logits = logits * spec.logit_scale
        if spec.final_softcap is not None:
            logits = torch.tanh(logits / spec.final_softcap) * spec.final_softcap
        return logits

    @property
    def head_weight(self) -> torch.Tensor | QuantizedWeight:
        """The LM head's weight (the embedding when tied; its quantized copy when there is
        one)."""
        if self.quantized_head is not None:
            return self.quantized_head
        head = self.embed if self.lm_head is None else self.lm_head
        assert head is not None
        return head

    def quantized_weights(self) -> list[QuantizedWeight]:
        """Every quantized weight the forward multiplies by (``model.quantization``)."""
        out = [self.head_weight]
        for layer in self.layers:
            out += [layer.qkv_weight, layer.o_weight, layer.gate_up_weight, layer.down_weight]
        return [w for w in out if isinstance(w, QuantizedWeight)]

    def matmul_weights(self) -> list[torch.Tensor]:
        """Every 2-D float weight the forward multiplies by (for ops that prepack them; the
        quantized ones have their own layout)."""
        out = [self.head_weight]
        for layer in self.layers:
            out += [w for w in (layer.qkv_weight, layer.o_weight, layer.gate_up_weight,
                                layer.down_weight, layer.router_weight) if w is not None]
        return [w for w in out if isinstance(w, torch.Tensor)]
