"""Attention backends over the paged KV pool; see :mod:`.base` for the seam.

:func:`select_backend` picks one at start-up (``model.attention_backend``). The setting is
``auto``, one entry, or a comma-separated list of entries tried in order; an entry is a
backend's name (``torch``, ``vllm-cpu``, ``native-cpu``, ``flashinfer``), a name with one code
path (``vllm-cpu:vec``, ``vllm-cpu:amx``), or an import path ``package.module:Class`` of an
:class:`AttentionBackend` of your own. ``auto`` is the measured order for this CPU kind
(:func:`auto_order`), then ``torch``.

No fast path runs in this process before it proved itself on this CPU: each candidate's code
paths and the layer ops it brings are probed in a child process on the model's shapes against a
float64 reference (:mod:`hermes_async.model.kernels`; verdicts cached under the hermes home).
A candidate that is missing, refuses the model statically, or fails its probe (a signal, a
hang, an error, wrong numbers) is skipped with its reason; the chosen backend runs only its
admitted layer ops. A single named backend that cannot run raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model import cpu_features
from hermes_async.model.attention.base import (
    AttentionBackend,
    AttentionPlan,
    BackendUnavailable,
    KVLayout,
    Ordering,
)
from hermes_async.model.attention.reference import TorchBackend
from hermes_async.model.cpu_features import CpuFeatures
from hermes_async.model.kernels.admission import DEFAULT_TIMEOUT_S, admit
from hermes_async.model.kernels.paths import KernelPath, Verdict, resolve
from hermes_async.model.kernels.shapes import ProbeShapes
from hermes_async.model.kernels.store import VerdictStore
from hermes_async.model.kv_pool import derive_block_size
from hermes_async.model.spec import ModelSpec

BACKENDS = ("auto", "torch", "vllm-cpu", "native-cpu", "flashinfer")
BACKEND_CLASSES = {
    "torch": "hermes_async.model.attention.reference:TorchBackend",
    "vllm-cpu": "hermes_async.model.attention.vllm_cpu:VllmCpuBackend",
    "native-cpu": "hermes_async.model.attention.native_cpu:NativeCpuBackend",
    "flashinfer": "hermes_async.model.attention.flashinfer_cuda:FlashInferBackend",
}

__all__ = ["BACKENDS", "AttentionBackend", "AttentionPlan", "BackendChoice", "BackendUnavailable",
           "KVLayout", "NATIVE_SCHEMES", "Ordering", "ProbeSettings", "TorchBackend", "auto_order",
           "select_backend", "select_for_config"]


@dataclass(frozen=True)
class ProbeSettings:
    """How the kernel probes run: per-path timeout; ``fresh`` ignores cached verdicts;
    ``store_dir``: where verdicts are kept (None: ``<hermes home>/kernels/verdicts``)."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    fresh: bool = False
    store_dir: Path | None = None


@dataclass(frozen=True)
class BackendChoice:
    backend: AttentionBackend
    reason: str  # for the start-up log line
    block_size: int  # the KV block size the backend runs with
    layer_op_parts: frozenset[str] = frozenset()  # the backend's layer ops that were admitted
    verdicts: tuple[Verdict, ...] = field(default=())  # every probe's, for the log and tables


@dataclass(frozen=True)
class _Candidate:
    label: str  # "vllm-cpu:amx"
    cls: type[AttentionBackend]
    path: str
    block_size: int
    kernel: KernelPath | None = None  # its attention probe (None: the reference, unprobed)
    layer_ops: tuple[KernelPath, ...] = ()  # the fast layer ops it brings, to probe

    def key(self, path: KernelPath) -> str:
        """The verdict of ``path`` among :func:`_probe`'s (probed per block size)."""
        return f"{self.block_size}/{path.name}"


def backend_block_size(name: str, block_size: int, configured: bool, path: str = "") -> int:
    """A derived block size rounded up to what the backend's kernels need (vLLM's AMX path:
    its default of 128, the block size its AMX kernels are tested at); a configured one is
    kept (the backend then refuses it if it must)."""
    if name != "vllm-cpu" or configured:
        return block_size
    from hermes_async.model.attention.vllm_cpu import AMX_BLOCK_SIZE, BLOCK_SIZE_MULTIPLE

    if path == "amx":
        return max(AMX_BLOCK_SIZE, block_size)
    return -(-block_size // BLOCK_SIZE_MULTIPLE) * BLOCK_SIZE_MULTIPLE


def parse_entries(setting: str) -> list[str]:
    """The entries of ``model.attention_backend`` (``auto`` stays one entry)."""
    return [e.strip() for e in setting.split(",") if e.strip()]


def resolve_entry(entry: str) -> tuple[type[AttentionBackend], str | None]:
    """The backend class an entry names and its code path (None: all of the class's)."""
    if entry in BACKEND_CLASSES:
        return resolve(BACKEND_CLASSES[entry]), None  # type: ignore[return-value]
    base, _, path = entry.partition(":")
    if base in BACKEND_CLASSES:
        return resolve(BACKEND_CLASSES[base]), path  # type: ignore[return-value]
    try:
        cls = resolve(entry)
    except (ImportError, AttributeError, ValueError) as e:
        raise BackendUnavailable(f"no attention backend {entry!r}: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, AttentionBackend)):
        raise BackendUnavailable(f"{entry!r} is not an AttentionBackend class")
    return cls, None


def _construct(c: _Candidate, spec: ModelSpec, dtype: torch.dtype,
               device: torch.device) -> AttentionBackend:
    if c.cls is TorchBackend:  # cascade attention applies no window mask and no soft-cap
        return TorchBackend(c.block_size, device,
                            use_cascade=(all(w is None for w in spec.sliding_windows)
                                         and spec.attn_softcap is None))
    if c.cls.name == "flashinfer":  # imports flashinfer itself, on CUDA only
        return c.cls(c.block_size, spec.num_heads, spec.num_kv_heads,  # type: ignore[call-arg]
                     spec.head_dim, dtype, device, spec.sliding_windows)
    if device.type != "cpu":
        raise BackendUnavailable(f"{c.label} runs on the CPU only")
    extra = {"path": c.path} if c.path else {}
    return c.cls(c.block_size, spec.num_heads, spec.num_kv_heads,  # type: ignore[call-arg]
                 spec.head_dim, dtype, spec.sliding_windows, **extra)


def _candidates(entries: Sequence[str], spec: ModelSpec, block_size: int, dtype: torch.dtype,
                device: torch.device, features: CpuFeatures, configured: bool,
                skipped: list[str]) -> list[_Candidate]:
    """Every code path of the entries that passes its static checks, in order; the others'
    reasons go to ``skipped``."""
    out = []
    for entry in entries:
        try:
            cls, path = resolve_entry(entry)
            if spec.attn_softcap is not None and not cls.supports_softcap:
                raise BackendUnavailable("its kernels have no attention soft-capping (Gemma 2)")
            paths = ((path,) if path is not None
                     else cls.code_paths(features, dtype, spec.head_dim))
            layer_ops = tuple(cls.layer_op_paths()) if cls.needs_probe else ()
            made = []
            for p in paths:
                bs = backend_block_size(cls.name, block_size, configured, p)
                if cls.needs_probe:
                    if device.type != "cpu":
                        raise BackendUnavailable("runs on the CPU only")
                    cls.check(bs, spec.num_heads, spec.num_kv_heads, spec.head_dim, dtype,
                              spec.sliding_windows)
                made.append(_Candidate(f"{cls.name}:{p}" if p else cls.name, cls, p, bs,
                                       cls.kernel_path(p) if cls.needs_probe else None,
                                       layer_ops))
        except (BackendUnavailable, ImportError, OSError) as e:
            skipped.append(f"{entry} unavailable: {e}")
            continue
        out.extend(made)
    return out


def _probe(candidates: Sequence[_Candidate], spec: ModelSpec, dtype: torch.dtype,
           features: CpuFeatures, settings: ProbeSettings,
           quantization: str = "none") -> dict[str, Verdict]:
    """Verdicts of every candidate's attention path and its layer ops (one child process
    per distinct block size, usually one)."""
    dtype_name = str(dtype).removeprefix("torch.")
    verdicts: dict[str, Verdict] = {}
    by_block: dict[int, list[KernelPath]] = {}
    for c in candidates:
        if c.kernel is None:
            continue
        paths = by_block.setdefault(c.block_size, [])
        names = {q.name for q in paths}
        paths.extend(p for p in (c.kernel, *c.layer_ops) if p.name not in names)
    for bs, paths in by_block.items():
        shapes = ProbeShapes.from_spec(spec, bs, dtype_name, torch.get_num_threads(),
                                       quantization)
        found = admit(paths, shapes, " ".join(sorted(features.flags)),
                      timeout_s=settings.timeout_s, fresh=settings.fresh,
                      store=VerdictStore(settings.store_dir))
        verdicts.update({f"{bs}/{name}": v for name, v in found.items()})
    return verdicts


def select_backend(name: str, spec: ModelSpec, block_size: int, dtype: torch.dtype,
                   device: torch.device, *, block_size_configured: bool = True,
                   features: CpuFeatures | None = None,
                   probe: ProbeSettings | None = None,
                   quantization: str = "none") -> BackendChoice:
    """The backend ``name`` (``auto``, an entry or a list of entries; module docstring) for
    this model and device, admitted by its probes (``quantization``: the weights' scheme,
    whose kernels are probed too).

    ``block_size_configured`` False: ``block_size`` was derived, and may be rounded up to what
    the chosen backend needs (the returned :attr:`BackendChoice.block_size`)."""
    features = features or cpu_features.current()
    settings = probe or ProbeSettings()
    entries = parse_entries(name)
    auto = entries == ["auto"]
    if auto:
        entries = [*auto_order(device, dtype, features, quantization), "torch"]
    if device.type == "cpu":  # before anything can run an AMX instruction
        cpu_features.request_amx(features)
    skipped: list[str] = []
    candidates = _candidates(entries, spec, block_size, dtype, device, features,
                             block_size_configured, skipped)
    verdicts = _probe(candidates, spec, dtype, features, settings, quantization)
    for c in candidates:
        if c.kernel is not None and not verdicts[c.key(c.kernel)].ok:
            skipped.append(f"{c.label} refused: {verdicts[c.key(c.kernel)].reason}")
            continue
        try:
            backend = _construct(c, spec, dtype, device)
        except (BackendUnavailable, ImportError, OSError) as e:
            skipped.append(f"{c.label} unavailable: {e}")
            continue
        parts = frozenset(p.name for p in c.layer_ops if verdicts[c.key(p)].ok)
        how = "auto" if auto else "configured"
        reason = f"{c.label} ({how}: {'; '.join(skipped)})" if skipped else f"{c.label} ({how})"
        return BackendChoice(backend, reason, c.block_size, parts, tuple(verdicts.values()))
    raise BackendUnavailable(f"no attention backend of {name!r} can run here: "
                             f"{'; '.join(skipped)}")


def select_for_config(model: ModelConfig, cache: CacheConfig, spec: ModelSpec,
                      dtype: torch.dtype, device: torch.device,
                      fresh: bool | None = None) -> BackendChoice:
    """:func:`select_backend` as the config asks (``model.attention_backend``, the configured
    or derived block size, the probe settings); ``fresh`` overrides ``model.kernel_probe``."""
    derived = derive_block_size(spec.num_kv_heads, spec.head_dim)
    probe = ProbeSettings(model.kernel_probe_timeout_s,
                          fresh=model.kernel_probe == "fresh" if fresh is None else fresh)
    return select_backend(model.attention_backend, spec, cache.block_size or derived, dtype,
                          device, block_size_configured=cache.block_size is not None,
                          probe=probe, quantization=model.quantization)


# model.quantization run by our kernels (gguf: a GGUF's blocks as int8 and int4 weights)
NATIVE_SCHEMES = ("int8", "int4", "int4-g128", "gguf")


def auto_order(device: torch.device, dtype: torch.dtype,
               features: CpuFeatures | None = None, quantization: str = "none") -> list[str]:
    """The backends ``auto`` tries before ``torch``, fastest first as measured per CPU kind:
    ``native-cpu`` leads in bfloat16 on CPUs with AVX512-BF16 and no AMX (measured faster than
    ``vllm-cpu`` on decode and prefill: BENCHMARKS.md), and with int8 / int4 weights on every
    CPU (its layer ops carry their kernels; vLLM's backend would multiply by weights
    dequantized per call; both have W8A8's); with AMX, ``vllm-cpu`` (its ``amx`` path, then
    ``vec``) before ``native-cpu``; vLLM's kernels measured faster in float32, ours next
    (sliding-window models, which vLLM's are not given, run on ours)."""
    if device.type == "cuda":
        return ["flashinfer"]
    if device.type != "cpu":
        return []
    features = features or cpu_features.current()
    if quantization in NATIVE_SCHEMES:
        return ["native-cpu", "vllm-cpu"]
    if dtype == torch.bfloat16 and features.avx512_bf16 and not features.amx_bf16:
        return ["native-cpu", "vllm-cpu"]
    if dtype == torch.bfloat16 and features.amx_bf16:
        return ["vllm-cpu", "native-cpu"]
    return ["vllm-cpu", "native-cpu"]
