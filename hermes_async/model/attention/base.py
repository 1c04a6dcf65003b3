"""The attention backend seam: plan once per step, then attend once per layer.

The runner hands a backend the step's :class:`~hermes_async.step.SequenceStep` list. The
backend picks the packed order (:meth:`AttentionBackend.order`; decodes first, then prefill
chunks), and, once the runner has computed every new token's position and pool slot, builds an
:class:`AttentionPlan` (:meth:`AttentionBackend.plan`): block tables, lengths and whatever its
kernels need, as tensors on the device. Each layer then calls :meth:`AttentionPlan.attend`,
which writes the layer's new K/V into the pool at their slots and returns the attention output
of every new token.

A backend also says how it wants the pool laid out (:attr:`AttentionBackend.kv_layout`):
``"nhd"`` is ``[num_blocks, block_size, kv_heads, head_dim]`` per layer for K and for V,
``"hnd"`` is ``[num_blocks, kv_heads, block_size, head_dim]``.

Backends: ``torch`` (:mod:`.reference`, plain torch, CPU and CUDA: the reference that every
other backend is tested against), ``vllm-cpu`` (:mod:`.vllm_cpu`, vLLM's CPU paged-attention
kernels, reading K/V in place), ``flashinfer`` (:mod:`.flashinfer_cuda`, CUDA, experimental:
never run on a GPU yet).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import torch

from hermes_async.model.cpu_features import CpuFeatures
from hermes_async.model.kernels.paths import ATTENTION, KernelPath
from hermes_async.model.layer_ops import TorchLayerOps
from hermes_async.model.spec import ModelSpec
from hermes_async.step import SequenceStep

KVLayout = Literal["nhd", "hnd"]


class BackendUnavailable(RuntimeError):
    """A backend cannot run here (missing library, unsupported device, dtype or shapes); the
    message says why (``auto`` logs it at start-up and falls back to ``torch``)."""


@dataclass(frozen=True)
class Ordering:
    """The packed order of a step: ``indices[p]`` is the step index at packed position ``p``;
    ``hint`` carries what the backend worked out on the way (e.g. cascade groups) to
    :meth:`AttentionBackend.plan`."""

    indices: list[int]
    hint: object = None


class AttentionPlan(ABC):
    """One step's attention inputs, shared by every layer."""

    @abstractmethod
    def attend(self, kv: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, scale: float, window: int | None,
               softcap: float | None = None) -> torch.Tensor:
        """Write ``k``/``v`` (``[T, kv_heads, d]``) into the layer's pool ``kv`` (K and V in the
        backend's layout), attend, and return ``[T, heads, d]`` in packed order. ``softcap``:
        scores become ``softcap * tanh(scores / softcap)`` before the softmax (only backends
        with :attr:`AttentionBackend.supports_softcap` are given one)."""


PROBE_ATTENTION = "hermes_async.model.kernels.probe_attention:probe_backend"


class AttentionBackend(ABC):
    """Builds plans for one model's shapes; stateless between steps.

    A fast backend is admitted before use (``hermes_async.model.kernels``): :meth:`check` says
    statically whether it can run the model (no library loaded, nothing run), :meth:`code_paths`
    lists its code paths on a CPU (each probed in a child process on the model's shapes), and
    :meth:`layer_op_paths` the fast layer ops it brings (each probed too). The constructor's
    signature is ``(block_size, num_heads, num_kv_heads, head_dim, dtype, sliding_windows)``
    plus ``path=`` for a backend with several code paths; the probe makes it the same way.
    """

    name: ClassVar[str]
    kv_layout: ClassVar[KVLayout] = "nhd"
    needs_probe: ClassVar[bool] = True  # False for the torch reference only
    supports_softcap: ClassVar[bool] = False  # attention soft-capping (Gemma 2)

    @classmethod
    def check(cls, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
              dtype: torch.dtype, sliding_windows: Sequence[int | None]) -> None:
        """Raise :class:`BackendUnavailable` where the backend cannot run these shapes or
        its library is missing; loads and runs nothing."""
        return None

    @classmethod
    def code_paths(cls, features: CpuFeatures, dtype: torch.dtype,
                   head_dim: int) -> tuple[str, ...]:
        """The backend's code paths on this CPU in this dtype, preferred first (``""``: it has
        one)."""
        return ("",)

    @classmethod
    def libraries(cls) -> tuple[Path, ...]:
        """The compiled files its kernels come from (their contents key the verdicts)."""
        return ()

    @classmethod
    def kernel_path(cls, path: str = "") -> KernelPath:
        """The attention probe of code path ``path``."""
        ref = f"{cls.__module__}:{cls.__qualname__}"
        return KernelPath(f"{cls.name}:{path}" if path else cls.name, ATTENTION, PROBE_ATTENTION,
                          (("backend", ref), ("path", path)), cls.libraries())

    @classmethod
    def layer_op_paths(cls) -> list[KernelPath]:
        """The fast layer ops this backend would use, each to be probed."""
        return []

    def prepare_weights(self, model: torch.nn.Module, dtype: torch.dtype,
                        parts: frozenset[str]) -> str | None:
        """Re-lay the loaded model's weights in place for this backend's admitted kernels
        (``parts``) before :meth:`layer_ops` is made; what was done, for the log (None:
        nothing, the default)."""
        return None

    def layer_ops(self, spec: ModelSpec, dtype: torch.dtype, weights: list[torch.Tensor],
                  parts: frozenset[str] | None = None) -> TorchLayerOps:
        """The decoder's other ops (linears, norms, rotary, activation) that go with this
        backend: plain torch unless its kernel library has faster ones; ``weights`` are the
        matmul weights, for ops that prepack them; ``parts``: the names of the
        :meth:`layer_op_paths` admitted (None: all of them, for benchmarks and tests that
        vouch for the kernels themselves)."""
        return TorchLayerOps(spec)

    def order(self, steps: Sequence[SequenceStep]) -> Ordering:
        """Decodes first (in the given order), then prefill chunks."""
        decodes = [i for i, s in enumerate(steps) if s.is_decode]
        return Ordering(decodes + [i for i, s in enumerate(steps) if not s.is_decode])

    @abstractmethod
    def plan(self, packed: Sequence[SequenceStep], slot_mapping: torch.Tensor,
             ordering: Ordering) -> AttentionPlan:
        """The plan of ``packed`` (the steps in :meth:`order`'s order); ``slot_mapping`` is the
        pool slot of every new token, on the device."""
