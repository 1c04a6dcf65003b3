"""A Llama-family decoder (Llama, Mistral, Qwen2, SmolLM) over the paged KV pool.

Weights are fused where one matmul can replace several (q/k/v, gate/up). The forward pass takes
one packed step (attention through the step's :class:`~hermes_async.model.attention.AttentionPlan`)
and returns logits only for the rows
asked for: the last new token of each sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hermes_async.model.attention import AttentionPlan
from hermes_async.model.kv_pool import KVPool
from hermes_async.model.layer_ops import TorchLayerOps
from hermes_async.model.spec import ModelSpec


class DecoderLayer(nn.Module):
    """One pre-norm attention + SwiGLU MLP block; parameters named after their HF sources."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype) -> None:
        super().__init__()
        h, qkv = spec.hidden_size, spec.q_size + 2 * spec.kv_size

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        self.input_norm = param(h)
        self.qkv_weight = param(qkv, h)
        self.qkv_bias = param(qkv) if spec.qkv_bias else None
        self.o_weight = param(h, spec.q_size)
        self.o_bias = param(h) if spec.o_bias else None
        self.post_norm = param(h)
        self.gate_up_weight = param(2 * spec.intermediate_size, h)
        self.gate_up_bias = param(2 * spec.intermediate_size) if spec.mlp_bias else None
        self.down_weight = param(h, spec.intermediate_size)
        self.down_bias = param(h) if spec.mlp_bias else None


class LlamaModel(nn.Module):
    """The decoder stack, embedding and LM head."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype) -> None:
        super().__init__()
        self.spec = spec
        self.embed = nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size, dtype=dtype),
                                  requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(spec, dtype) for _ in range(spec.num_layers))
        self.final_norm = nn.Parameter(torch.empty(spec.hidden_size, dtype=dtype),
                                       requires_grad=False)
        self.lm_head = (
            None if spec.tie_word_embeddings
            else nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size, dtype=dtype),
                              requires_grad=False)
        )
        self.ops = TorchLayerOps(spec)  # the runner may swap in fused kernels

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
        residual = F.embedding(input_ids, self.embed)
        scale = spec.head_dim ** -0.5
        split = [spec.q_size, spec.kv_size, spec.kv_size]
        rope = ops.rope(positions, residual.dtype)
        h = ops.rms_norm(residual, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            q, k, v = ops.linear(h, layer.qkv_weight, layer.qkv_bias).split(split, dim=-1)
            q, k = ops.rotary(rope, q.view(t, spec.num_heads, spec.head_dim),
                              k.view(t, spec.num_kv_heads, spec.head_dim))
            v = v.view(t, spec.num_kv_heads, spec.head_dim)
            attn = plan.attend(pool.blocks(i), q, k, v, scale, spec.sliding_windows[i])
            o = ops.linear(attn.reshape(t, spec.q_size), layer.o_weight, layer.o_bias)
            h, residual = ops.add_rms_norm(o, residual, layer.post_norm, eps)
            act = ops.silu_mul(ops.linear(h, layer.gate_up_weight, layer.gate_up_bias))
            down = ops.linear(act, layer.down_weight, layer.down_bias)
            nxt = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else None
            if nxt is not None:  # the next layer's input norm, fused with the residual add
                h, residual = ops.add_rms_norm(down, residual, nxt, eps)
            else:
                residual = residual + down
        last = ops.rms_norm(residual[logits_indices], self.final_norm, eps)
        return ops.linear(last, self.head_weight).float()

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's weight (the embedding when tied)."""
        return self.embed if self.lm_head is None else self.lm_head

    def matmul_weights(self) -> list[torch.Tensor]:
        """Every 2-D weight the forward multiplies by (for ops that prepack them)."""
        out = [self.head_weight]
        for layer in self.layers:
            out += [layer.qkv_weight, layer.o_weight, layer.gate_up_weight, layer.down_weight]
        return out
