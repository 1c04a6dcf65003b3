"""What this CPU can run: its instruction-set flags, read once, and the choices made from them.

Every decision that depends on the CPU (which vLLM library build loads, which of its attention
code paths exist, which backends ``auto`` tries first, the ``auto`` dtype) takes a
:class:`CpuFeatures` made from a flag string, so it is testable over the real flag strings of
each CPU kind (``tests/model/test_cpu_features.py``: Zen 4, Skylake / Ice Lake without bf16,
Sapphire Rapids with AMX) on any machine. :func:`current` reads this machine's
``/proc/cpuinfo``.

AMX needs one more thing than the flag: Linux hands out the tile-data state only to a process
that asked for it (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); an AMX instruction
before that dies of SIGILL. :func:`request_amx` asks (torch exposes the call as
``torch._C._cpu._init_amx``; vLLM's CPU tests call it, and its server gets the permission
from oneDNN's first AMX matmul, which asks for itself: vLLM's attention kernels do not).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hermes_async.model.dtype import read_cpu_flags


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's feature flags (lower case, as ``/proc/cpuinfo`` spells them)."""

    flags: frozenset[str]

    @classmethod
    def from_flags(cls, text: str) -> CpuFeatures:
        return cls(frozenset(text.lower().split()))

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def avx512(self) -> bool:
        """The AVX-512 subset vLLM's and torch's AVX-512 builds need."""
        return all(self.has(f) for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))

    @property
    def avx512_bf16(self) -> bool:
        return self.has("avx512_bf16")

    @property
    def amx_bf16(self) -> bool:
        """AMX tiles with bfloat16 matmuls (Sapphire Rapids and later)."""
        return self.has("amx_tile") and self.has("amx_bf16")

    @property
    def native_bf16(self) -> bool:
        """bfloat16 dot products in hardware (AVX512-BF16 or AMX-BF16)."""
        return self.avx512_bf16 or self.amx_bf16

    @property
    def kind(self) -> str:
        """A short name of the CPU class, for logs and benchmark records."""
        if self.amx_bf16:
            return "x86 with AMX-BF16"
        if self.avx512_bf16:
            return "x86 with AVX512-BF16, no AMX"
        if self.avx512:
            return "x86 with AVX-512, no BF16"
        if self.has("avx2"):
            return "x86 with AVX2"
        return "other"

    def summary(self) -> str:
        """The flags that decide the kernels, e.g. ``avx2 avx512f avx512_bf16``."""
        keys = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
        return " ".join(f for f in keys if self.has(f)) or "none of avx2/avx512/amx"


def current() -> CpuFeatures:
    """This machine's CPU (empty flags where ``/proc/cpuinfo`` has none)."""
    return CpuFeatures.from_flags(read_cpu_flags())


def request_amx(features: CpuFeatures) -> bool:
    """Ask Linux for the AMX tile-data permission where the CPU has AMX (before any AMX code
    runs: oneDNN's and vLLM's AMX kernels, and ours). True when granted; False where the CPU
    has no AMX or the kernel refuses (AMX code then fails its probe: SIGILL in a child)."""
    if not features.has("amx_tile"):
        return False
    init = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
    if init is None:
        return False
    try:
        return bool(init())
    except RuntimeError:
        return False
