"""The decoder's ops other than attention: linear projections, RMSNorm, residual add +
RMSNorm, rotary embedding, SiLU-and-multiply.

:class:`TorchLayerOps` is plain torch (several small ops each, as transformers computes them:
the reference). :class:`VllmCpuLayerOps` runs each from the same vLLM CPU library as the
``vllm-cpu`` attention backend: the linears through oneDNN matmuls over weights prepacked once
at start-up (``create_onednn_mm_handler`` / ``onednn_mm``: 1.3-4.7x faster than ``F.linear``
at decode batch sizes on a Zen 4, bit-identical in bfloat16), the rest as one fused kernel each
(``rms_norm``, ``fused_add_rms_norm``, ``rotary_embedding``, ``silu_and_mul``). That backend
provides it (``AttentionBackend.layer_ops``). Both compute in float32 inside the norms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hermes_async.model.packed import PackedExperts
from hermes_async.model.quant.w8a8 import reference as w8a8_reference
from hermes_async.model.quant.weights import W8A8, QuantizedWeight
from hermes_async.model.spec import ModelSpec


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox RoPE of each head's first ``cos.shape[-1]`` dimensions (all of them but with
    partial rotary, whose other dimensions pass through unrotated)."""
    rotated = cos.shape[-1]
    if rotated == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    head, rest = x[..., :rotated], x[..., rotated:]
    return torch.cat((head * cos + rotate_half(head) * sin, rest), dim=-1)


class TorchLayerOps:
    """Plain torch; rotary tables computed per step from the positions."""

    parts: tuple[str, ...] = ()  # the fast kernel families in use (subclasses)

    @property
    def name(self) -> str:
        """The kernel families in use, ``+``-joined (``torch`` for none)."""
        return "+".join(self.parts) or "torch"

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        # each RoPE table's inv_freq per device
        self._inv_freq: dict[tuple[torch.device, int], torch.Tensor] = {}

    def linear(self, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(weight, QuantizedWeight):
            return self.quantized_linear(x, weight, bias)
        return F.linear(x, weight, bias)

    def embedding(self, ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the token table ``[V, H]``."""
        return F.embedding(ids, table)

    def release_float_weights(self) -> int:
        """Drop the loaded copy of each float weight these ops hold in kernels' own copies
        for every step size (and read a tied table's rows from them: :meth:`embedding`): its
        ``data`` becomes a NaN broadcast of the same shape, so that a stray read shows. The
        bytes released; here none (plain torch reads them)."""
        return 0

    def decode_copy(self, weight: torch.Tensor) -> torch.Tensor:
        """The tensor a decode step of one row reads for the float ``weight``: a kernel's own
        copy where these ops hold one, else the weight (here always the weight)."""
        return weight

    def quantized_linear(self, x: torch.Tensor, weight: QuantizedWeight,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` times a quantized weight: here the reference, the weight dequantized
        (``q * scale`` in float32, rounded to ``x``'s dtype) for each call; W8A8 weights
        with the activations quantized per row first, in float32 (:mod:`.quant.w8a8`)."""
        if weight.scheme == W8A8:
            out = w8a8_reference(x, weight, torch.float32).to(x.dtype)
            return out if bias is None else out + bias
        return F.linear(x, weight.dequantize(x.dtype), bias)

    def grouped_mm(self, x: torch.Tensor, weights: torch.Tensor | PackedExperts,
                   offsets: torch.Tensor) -> torch.Tensor:
        """``x`` ``[P, K]`` (rows sorted by group) times ``weights`` ``[G, K, N]``: rows
        ``offsets[g - 1]`` to ``offsets[g]`` (int32 cumulative ends) by group ``g``; ``[P, N]``
        in ``x``'s dtype (torch's ``_grouped_mm``: one matmul per group; packed experts
        unpacked first, the reference)."""
        if isinstance(weights, PackedExperts):
            weights = weights.unpack()
        return torch._grouped_mm(x, weights, offs=offsets)

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
        sin ``[T, 1, head_dim]`` of each of the spec's RoPE tables."""
        out = []
        for table, (inv, scaling) in enumerate(self.spec.rope_tables):
            inv_freq = self._inv_freq.get((positions.device, table))
            if inv_freq is None:  # copied once: a CUDA graph can capture no host-to-device copy
                inv_freq = inv.to(positions.device).float()
                self._inv_freq[positions.device, table] = inv_freq
            freqs = positions[:, None].float() * inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            out.append(((emb.cos() * scaling).to(dtype)[:, None, :],
                        (emb.sin() * scaling).to(dtype)[:, None, :]))
        switch = self.spec.rope_switch_position
        if switch is not None:  # longrope: table 0 is short before the switch, long from it
            late = (positions >= switch)[:, None, None]
            out[0] = (torch.where(late, out[1][0], out[0][0]),
                      torch.where(late, out[1][1], out[0][1]))
        return out

    def rotary(self, rope: object, q: torch.Tensor, k: torch.Tensor,
               table: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` ``[T, heads, d]`` and ``k`` ``[T, kv_heads, d]`` (neox layout) with
        RoPE table ``table``; with partial rotary only the first ``spec.rotary_dim`` of each
        head's dimensions (the table's width), the others pass through."""
        cos, sin = rope[table]  # type: ignore[index]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def act_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The gated MLP's ``act(gate) * up`` with the model's activation."""
        if self.spec.activation == "silu":
            return self.silu_mul(gate_up)
        return self.gelu_tanh_mul(gate_up)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class OneDnnHandle:
    """A oneDNN matmul handle of vLLM's library (``handle``, set by the subclass), released
    with this object."""

    ops: object
    handle: torch.Tensor

    def __del__(self) -> None:
        self.ops.release_dnnl_matmul_handler(int(self.handle.item()))  # type: ignore[attr-defined]


class OneDnnLinear(OneDnnHandle):
    """One weight ``[N, K]`` prepacked by oneDNN for ``x @ weight.T``."""

    def __init__(self, ops: object, weight: torch.Tensor) -> None:
        self.ops = ops
        self.n, self.k = weight.shape
        handle = ops.create_onednn_mm_handler(weight.t(), 32)  # type: ignore[attr-defined]
        self.handle = torch.tensor(handle, dtype=torch.int64)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = torch.empty(*x.shape[:-1], self.n, dtype=x.dtype, device=x.device)
        self.ops.onednn_mm(out, x.reshape(-1, self.k), bias,  # type: ignore[attr-defined]
                           self.handle)
        return out


class OneDnnW8A8(OneDnnHandle):
    """One W8A8 weight (per-channel int8, :mod:`.quant.w8a8`) prepacked by oneDNN, run as
    vLLM's CPU build does it: ``dynamic_scaled_int8_quant`` (per-row int8 activations), then
    ``onednn_scaled_mm`` (int8 matmul, scales and bias applied, output in ``x``'s dtype)."""

    def __init__(self, ops: object, weight: QuantizedWeight, dtype: torch.dtype) -> None:
        self.ops = ops
        self.n, self.k = weight.shape
        self.input_scale = weight.input_scale
        q, scales, _ = weight.rows()
        handle = ops.create_onednn_scaled_mm_handler(  # type: ignore[attr-defined]
            q.t(), scales.reshape(self.n).float().contiguous(), dtype, True, False, 32)
        self.handle = torch.tensor(handle, dtype=torch.int64)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.reshape(-1, self.k).contiguous()
        if self.input_scale is not None:  # smoothed (quant.smooth): quantize x / s
            rows = rows.float() * self.input_scale
        q = torch.empty_like(rows, dtype=torch.int8)
        scales = torch.empty(rows.shape[0], 1, dtype=torch.float32)
        self.ops.dynamic_scaled_int8_quant(q, rows, scales, None)  # type: ignore[attr-defined]
        out = torch.empty(rows.shape[0], self.n, dtype=x.dtype)
        self.ops.onednn_scaled_mm(out, q, scales, None, None, bias,  # type: ignore[attr-defined]
                                  self.handle)
        return out.view(*x.shape[:-1], self.n)


def prepare_onednn_w8a8(ops: object, model: torch.nn.Module, dtype: torch.dtype) -> str | None:
    """Prepack every W8A8 weight of ``model`` for oneDNN (``weight.kernel``); the integers
    stay for the reference. What was done, for the log."""
    weights = [w for w in model.quantized_weights()  # type: ignore[attr-defined]
               if w.scheme == W8A8]
    for w in weights:
        w.kernel = OneDnnW8A8(ops, w, dtype)
    return f"{len(weights)} W8A8 linears prepacked for oneDNN" if weights else None


class VllmCpuLayerOps(TorchLayerOps):
    """The same ops as vLLM CPU kernels (in place where the kernel is; inputs are fresh
    tensors of the forward, never weights). ``weights``: every 2-D weight the forward
    multiplies by, prepacked here when ``linears`` (the ``onednn-linear`` path); ``fused``: the
    norms, rotary and SiLU kernels (the ``vllm-fused-ops`` path); ``w8a8``: W8A8 weights run
    by their oneDNN handles (``onednn-w8a8``, prepacked by :func:`prepare_onednn_w8a8`).
    Each is on only where its probe admitted it (``hermes_async.model.kernels``); off, the
    plain torch op runs."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, ops: object,
                 weights: list[torch.Tensor], *, linears: bool = True,
                 fused: bool = True, w8a8: bool = False) -> None:
        super().__init__(spec)
        self.ops = ops
        self.fused = fused
        # by the weight's identity (its data may be released: release_float_weights), the
        # weight held beside its handle so that the id is never another's
        self._linears = ({id(w): (w, OneDnnLinear(ops, w)) for w in weights} if linears
                         else {})
        self.parts = tuple(name for name, on in (("onednn-linear", linears and bool(weights)),
                                                 ("onednn-w8a8", w8a8),
                                                 ("vllm-fused-ops", fused)) if on)
        if fused:
            positions = torch.arange(spec.max_position_embeddings, dtype=torch.float32)
            self.cos_sin = []  # per RoPE table
            for inv, scaling in spec.rope_tables:
                freqs = positions[:, None] * inv.float()[None, :]
                # [max_pos, rotary_dim]: cos then sin of each frequency, as the kernel reads
                # them (its width is the rotated part of a head: partial rotary)
                self.cos_sin.append(torch.cat(((freqs.cos() * scaling),
                                               (freqs.sin() * scaling)), dim=-1).to(dtype))
            switch = spec.rope_switch_position
            if switch is not None:  # longrope: short rows, then the long table's
                self.cos_sin[0] = torch.cat((self.cos_sin[0][:switch], self.cos_sin[1][switch:]))

    def linear(self, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(weight, QuantizedWeight):
            return self.quantized_linear(x, weight, bias)
        held, packed = self._linears.get(id(weight), (None, None))
        if held is not weight or packed is None:  # not prepacked (refused, or added later)
            return F.linear(x, weight, bias)
        return packed(x.contiguous(), bias)

    def quantized_linear(self, x: torch.Tensor, weight: QuantizedWeight,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
        """W8A8 weights prepacked for oneDNN (the ``onednn-w8a8`` path) through it; the rest
        the reference."""
        if isinstance(weight.kernel, OneDnnW8A8) and x.dtype in (torch.bfloat16,
                                                                 torch.float32):
            return weight.kernel(x, bias)
        return super().quantized_linear(x, weight, bias)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if not self.fused:
            return super().rms_norm(x, weight, eps)
        out = torch.empty_like(x)
        self.ops.rms_norm(out, x.contiguous(), weight, eps)  # type: ignore[attr-defined]
        return out

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.fused:
            return super().add_rms_norm(x, residual, weight, eps)
        x = x.contiguous()
        residual = residual.contiguous()
        self.ops.fused_add_rms_norm(x, residual, weight, eps)  # type: ignore[attr-defined]
        return x, residual

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> object:
        if not self.fused:
            return super().rope(positions, dtype)
        return positions  # the kernel reads its cos/sin table by position

    def rotary(self, rope: object, q: torch.Tensor, k: torch.Tensor,
               table: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.fused:
            return super().rotary(rope, q, k, table)
        positions = rope
        t, heads, d = q.shape
        q2, k2 = q.reshape(t, -1).contiguous(), k.reshape(t, -1).contiguous()
        self.ops.rotary_embedding(positions, q2, k2, d,  # type: ignore[attr-defined]
                                  self.cos_sin[table], True)
        return q2.view(t, heads, d), k2.view(t, k.shape[1], d)

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return super().gelu_tanh_mul(gate_up)
        return gated(self.ops.gelu_tanh_and_mul, gate_up)  # type: ignore[attr-defined]

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return super().silu_mul(gate_up)
        return gated(self.ops.silu_and_mul, gate_up)  # type: ignore[attr-defined]


def gated(kernel: object, gate_up: torch.Tensor) -> torch.Tensor:
    """``kernel(out, gate_up)`` of a gated-activation op into a fresh ``[..., I]`` output."""
    out = torch.empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2, dtype=gate_up.dtype,
                      device=gate_up.device)
    kernel(out, gate_up.contiguous())  # type: ignore[operator]
    return out
