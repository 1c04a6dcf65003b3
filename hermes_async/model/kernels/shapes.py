"""The shapes a kernel probe runs: the model's, as far as its kernels see them.

A probe never needs the weights, only their shapes: it multiplies random matrices of the
model's linear shapes, attends with the model's head counts, head size, block size and dtype.
:class:`ProbeShapes` is plain JSON-able data: it travels to the probe's child process and, with
the CPU and the libraries, keys the cached verdicts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hermes_async.model.spec import ModelSpec


@dataclass(frozen=True)
class ProbeShapes:
    """What the kernels of one model see; ``linears`` are the distinct ``(N, K)`` weight shapes
    (``x @ W.T`` with ``W`` ``[N, K]``), ``windows`` the distinct sliding windows (None: full),
    ``experts`` the mixture-of-experts block's (experts, top k, hidden, expert intermediate),
    empty without one, ``quantization`` the linears' weight scheme (``model.quantization``),
    ``rotary_dim`` the dimensions of a head RoPE rotates (0: all of them; partial rotary)."""

    dtype: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    hidden_size: int
    intermediate_size: int
    linears: tuple[tuple[int, int], ...]
    windows: tuple[int | None, ...] = (None,)
    rope_theta: float = 10000.0
    num_threads: int = 1
    experts: tuple[int, ...] = ()
    quantization: str = "none"
    rotary_dim: int = 0

    @classmethod
    def from_spec(cls, spec: ModelSpec, block_size: int, dtype: str,
                  num_threads: int, quantization: str = "none") -> ProbeShapes:
        """The shapes of a Llama-family model (fused q/k/v and gate/up, the LM head)."""
        h = spec.hidden_size
        linears = [(spec.q_size + 2 * spec.kv_size, h), (h, spec.q_size),
                   (2 * spec.intermediate_size, h), (h, spec.intermediate_size),
                   (spec.vocab_size, h)]
        windows = sorted(set(spec.sliding_windows), key=lambda w: -1 if w is None else w)
        experts = ((spec.num_experts, spec.experts_per_token, h, spec.moe_intermediate_size)
                   if any(spec.moe_layers) else ())
        return cls(dtype=dtype, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                   head_dim=spec.head_dim, block_size=block_size, hidden_size=h,
                   intermediate_size=spec.intermediate_size,
                   linears=tuple(dict.fromkeys(linears)), windows=tuple(windows),
                   num_threads=num_threads, experts=experts, quantization=quantization,
                   rotary_dim=0 if spec.rotary_dim == spec.head_dim else spec.rotary_dim)

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProbeShapes:
        fields = dict(data)
        fields["linears"] = tuple(tuple(x) for x in fields["linears"])  # type: ignore[union-attr]
        fields["windows"] = tuple(fields["windows"])  # type: ignore[arg-type]
        fields["experts"] = tuple(fields.get("experts", ()))  # type: ignore[arg-type]
        return cls(**fields)  # type: ignore[arg-type]

    def describe(self) -> str:
        return (f"{self.dtype}, {self.num_heads}/{self.num_kv_heads} heads x {self.head_dim}, "
                f"blocks of {self.block_size}, {self.num_threads} threads")
