"""The CUDA backend (``flashinfer``): FlashInfer's paged decode and prefill kernels, K/V read in
place from the ``nhd`` pool. Experimental: written and unit-tested without a GPU (see the
README's "CUDA (experimental)"); ``scripts/device_check.sh`` runs its CUDA checks.

``flashinfer`` (the ``gpu`` extra, ``flashinfer-python``) is imported lazily, when a backend is
built on CUDA: importing this module needs only torch, so CPU machines never load it.

One step (:meth:`FlashInferBackend.plan`): CSR page tables (``indptr``, ``indices``,
``last_page_len``; int32, built on the host) for the decodes and for the prefill chunks (with
``qo_indptr``), and one ``plan()`` per wrapper. Each layer (:meth:`FlashInferPlan.attend`)
writes its new K/V into the pool at their slots (an ``index_copy_`` into the pool's slot view,
as the reference backend does: no extra kernel module to build), then runs the decode wrapper
on the decode rows and the prefill wrapper (causal) on the prefill rows, each writing straight
into its rows of the output. FlashInfer's causal mask is aligned to the end of each sequence's
context, so a chunk after a cached prefix sees the prefix and its own earlier tokens, as the
reference's offset mask does.

Kernels: FlashInfer's FA2 templates (``backend="fa2"``) for both wrappers, decode through the
tensor-core path, so one JIT module per (dtype, head_dim, sliding window or not) serves decodes
and prefills alike. FlashInfer compiles its kernels at first use with the CUDA toolkit's nvcc
(minutes, then cached under ``~/.cache/flashinfer``); the probe at start-up does it, not the
first request. FA3 (Hopper) may be faster for long prefills but is another module per shape:
not measured yet. Shared-prefix (cascade) decoding is not used: the decode kernel reads every
sequence's blocks in place, shared or not.

Sliding windows are applied, not refused. FlashInfer's ``window_left`` is inclusive (a query at
position ``p`` sees keys ``p - window_left .. p``); the reference's window of ``w`` tokens
(keys ``p - w + 1 .. p``, as transformers' Mistral) is therefore ``window_left = w - 1``
(:func:`window_left`). ``window_left`` is fixed when a wrapper is planned, so the backend keeps
a decode and a prefill wrapper per distinct window among the model's layers.

Dtypes: float16 and bfloat16 (FlashInfer has no float32 kernels: :class:`BackendUnavailable`).

A plan stays valid until the backend's next :meth:`FlashInferBackend.plan` (wrappers and
workspace are reused), which holds while forwards run one at a time, as the runner's do.
CUDA graphs for decode batches (:mod:`hermes_async.model.cuda_graphs`) use
:meth:`FlashInferBackend.graph_plan`: fixed-size plans over fixed device buffers.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
from collections.abc import Sequence
from types import ModuleType

import torch

from hermes_async.model.attention.base import (
    AttentionBackend,
    AttentionPlan,
    BackendUnavailable,
    Ordering,
)
from hermes_async.step import SequenceStep

log = logging.getLogger("hermes_async.model")

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
DEVICE_TYPES = ("cuda",)  # the CPU tests of the plumbing add "cpu" with a stand-in module
WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace (split-KV partials)
KERNELS = "fa2"
INSTALL_HINT = "the gpu extra: pip install -e '.[gpu]'; make setup installs it where a GPU is seen"


def import_flashinfer(name: str = "flashinfer") -> ModuleType:
    """The ``flashinfer`` package, imported on first use; :class:`BackendUnavailable` with the
    reason when it is missing or does not import."""
    if importlib.util.find_spec(name) is None:
        raise BackendUnavailable(f"{name} is not installed ({INSTALL_HINT})")
    try:
        return importlib.import_module(name)
    except Exception as e:  # a broken install: a missing dependency, a CUDA mismatch
        raise BackendUnavailable(f"flashinfer does not import: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:200] if str(e) else ''}") from e


def window_left(window: int | None) -> int:
    """FlashInfer's inclusive ``window_left`` for a window of ``window`` tokens (-1: none)."""
    return -1 if window is None else window - 1


def page_table(steps: Sequence[SequenceStep], block_size: int, pad_rows: int = 0,
               pad_block: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's CSR page table of ``steps`` (each covering its whole context, new tokens
    included): ``indptr`` ``[B + 1]``, ``indices`` (block ids), ``last_page_len`` ``[B]`` (1 to
    ``block_size``), int32 on the host. ``pad_rows`` more rows of one token in ``pad_block``."""
    indptr, indices, last = [0], [], []
    for s in steps:
        n = -(-s.context_len // block_size)
        indices.extend(s.block_table[:n])
        indptr.append(len(indices))
        last.append(s.context_len - (n - 1) * block_size)
    for _ in range(pad_rows):
        indices.append(pad_block)
        indptr.append(len(indices))
        last.append(1)
    return (torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32),
            torch.tensor(last, dtype=torch.int32))


def qo_indptr(steps: Sequence[SequenceStep]) -> torch.Tensor:
    """Where each step's new tokens start in the packed rows (int32, ``[B + 1]``, host)."""
    starts = [0]
    for s in steps:
        starts.append(starts[-1] + s.num_new_tokens)
    return torch.tensor(starts, dtype=torch.int32)


class FlashInferPlan(AttentionPlan):
    """One step's planned wrappers: rows ``[0, num_decodes)`` are decodes, the rest prefill
    chunks; wrappers keyed by ``window_left``."""

    def __init__(self, slot_mapping: torch.Tensor, num_decodes: int, decode: dict[int, object],
                 prefill: dict[int, object], sm_scale: float) -> None:
        self.slot_mapping = slot_mapping
        self.num_decodes = num_decodes
        self.decode = decode  # empty when the step has no decodes
        self.prefill = prefill  # empty when it has no prefill chunks
        self.sm_scale = sm_scale

    def attend(self, kv: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, scale: float, window: int | None,
               softcap: float | None = None) -> torch.Tensor:
        if not math.isclose(scale, self.sm_scale, rel_tol=1e-6):
            raise ValueError(f"planned for softmax scale {self.sm_scale}, called with {scale}")
        k_cache, v_cache = kv
        kv_heads, head_dim = k_cache.shape[-2], k_cache.shape[-1]
        k_cache.view(-1, kv_heads, head_dim).index_copy_(0, self.slot_mapping, k)
        v_cache.view(-1, kv_heads, head_dim).index_copy_(0, self.slot_mapping, v)
        wl = window_left(window)
        out = torch.empty_like(q)
        n = self.num_decodes
        if self.decode:
            self.decode[wl].run(q[:n], kv, out=out[:n])  # type: ignore[attr-defined]
        if self.prefill:
            self.prefill[wl].run(q[n:], kv, out=out[n:])  # type: ignore[attr-defined]
        return out


class GraphDecodePlan(FlashInferPlan):
    """A decode-only plan of ``batch_size`` rows over fixed device buffers, for CUDA graphs:
    :meth:`update` re-plans it for a step's decodes (host side, outside any graph) and pads the
    remaining rows with one-token rows in ``pad_block``; kernels captured over :meth:`attend`
    read the new plan through the same buffers."""

    def __init__(self, backend: FlashInferBackend, batch_size: int, max_pages: int,
                 slot_mapping: torch.Tensor) -> None:
        fi, dev = backend.fi, backend.device
        decode = {}
        for wl in backend.windows:
            decode[wl] = fi.BatchDecodeWithPagedKVCacheWrapper(
                backend.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=torch.zeros(batch_size + 1, dtype=torch.int32,
                                                   device=dev),
                paged_kv_indices_buffer=torch.zeros(batch_size * max_pages, dtype=torch.int32,
                                                    device=dev),
                paged_kv_last_page_len_buffer=torch.zeros(batch_size, dtype=torch.int32,
                                                          device=dev),
                backend=KERNELS)
        super().__init__(slot_mapping, batch_size, decode, {}, backend.sm_scale)
        self.backend = backend
        self.batch_size = batch_size
        self.max_pages = max_pages

    def update(self, steps: Sequence[SequenceStep], pad_block: int) -> None:
        if len(steps) > self.batch_size:
            raise ValueError(f"{len(steps)} decodes in a plan of {self.batch_size}")
        b = self.backend
        tables = page_table(steps, b.block_size, self.batch_size - len(steps), pad_block)
        for wl, wrapper in self.decode.items():
            wrapper.plan(*tables, b.num_heads, b.num_kv_heads, b.head_dim,  # type: ignore[attr-defined]
                         b.block_size, **b.plan_kwargs(wl))


class FlashInferBackend(AttentionBackend):
    """FlashInfer over the ``nhd`` pool on CUDA, float16 or bfloat16, sliding windows applied."""

    name = "flashinfer"
    kv_layout = "nhd"
    # the kernel probes run on the CPU; on CUDA this backend's own probe (below) and
    # scripts/device_check.sh's parity suite stand for them
    needs_probe = False

    def __init__(self, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device,
                 sliding_windows: Sequence[int | None]) -> None:
        if dtype not in SUPPORTED_DTYPES:
            raise BackendUnavailable(f"FlashInfer's kernels run float16 or bfloat16, not {dtype}")
        if device.type not in DEVICE_TYPES:
            raise BackendUnavailable("flashinfer runs on CUDA only")
        self.fi = import_flashinfer()
        self.block_size, self.dtype, self.device = block_size, dtype, device
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.sm_scale = head_dim ** -0.5
        self.model_windows = sorted(set(sliding_windows), key=window_left)
        self.windows = tuple(window_left(w) for w in self.model_windows)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        fi = self.fi
        self._decode = {wl: fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=True, backend=KERNELS) for wl in self.windows}
        self._prefill = {wl: fi.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend=KERNELS) for wl in self.windows}
        self._probe()

    def plan_kwargs(self, wl: int) -> dict[str, object]:
        return dict(pos_encoding_mode="NONE", window_left=wl, q_data_type=self.dtype,
                    kv_data_type=self.dtype, sm_scale=self.sm_scale)

    def _probe(self) -> None:
        """One decode and one prefill chunk with this model's shapes, per window: FlashInfer
        builds (or loads) its kernels here, and a shape or dtype it refuses raises
        :class:`BackendUnavailable` at start-up, not in the first request."""
        bs, kvh, d, dev = self.block_size, self.num_kv_heads, self.head_dim, self.device
        log.info("flashinfer %s: loading kernels for head_dim %d, %s (the first run on a "
                 "machine compiles them with nvcc: minutes)",
                 getattr(self.fi, "__version__", "?"), d, str(self.dtype).removeprefix("torch."))
        kv = (torch.zeros(4, bs, kvh, d, dtype=self.dtype, device=dev),
              torch.zeros(4, bs, kvh, d, dtype=self.dtype, device=dev))
        steps = [SequenceStep((0, 1), 1, (5,)), SequenceStep((2, 3), 0, (1, 2))]
        slots = torch.tensor([1, 2 * bs, 2 * bs + 1], dtype=torch.long, device=dev)
        q = torch.randn(3, self.num_heads, d, dtype=self.dtype, device=dev)
        k = torch.randn(3, kvh, d, dtype=self.dtype, device=dev)
        try:
            plan = self.plan(steps, slots, Ordering([0, 1]))
            for w in self.model_windows:
                out = plan.attend(kv, q, k, k, self.sm_scale, w)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        except Exception as e:  # a JIT build failure, an unsupported head size or GPU
            msg = str(e).strip().splitlines()
            raise BackendUnavailable(f"FlashInfer refuses this model or could not build its "
                                     f"kernels: {type(e).__name__}: "
                                     f"{msg[0][:200] if msg else ''}") from e
        if not torch.isfinite(out.float()).all():
            raise BackendUnavailable("FlashInfer's probe returned non-finite values")

    def plan(self, packed: Sequence[SequenceStep], slot_mapping: torch.Tensor,
             ordering: Ordering) -> FlashInferPlan:
        h, kvh, d, bs = self.num_heads, self.num_kv_heads, self.head_dim, self.block_size
        n = sum(1 for s in packed if s.is_decode)  # decodes first (AttentionBackend.order)
        decodes, prefills = packed[:n], packed[n:]
        if decodes:
            tables = page_table(decodes, bs)
            for wl, w in self._decode.items():
                w.plan(*tables, h, kvh, d, bs, **self.plan_kwargs(wl))
        if prefills:
            qo = qo_indptr(prefills)
            tables = page_table(prefills, bs)
            for wl, w in self._prefill.items():
                w.plan(qo, *tables, h, kvh, d, bs, causal=True, **self.plan_kwargs(wl))
        return FlashInferPlan(slot_mapping, n, self._decode if decodes else {},
                              self._prefill if prefills else {}, self.sm_scale)

    def graph_plan(self, batch_size: int, max_pages: int,
                   slot_mapping: torch.Tensor) -> GraphDecodePlan:
        """A fixed-size decode plan for CUDA graphs (rows of at most ``max_pages`` blocks),
        writing K/V at ``slot_mapping`` (a static device buffer of ``batch_size`` slots)."""
        return GraphDecodePlan(self, batch_size, max_pages, slot_mapping)
