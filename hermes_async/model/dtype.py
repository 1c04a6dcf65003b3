"""``model.dtype = "auto"``: the weights and KV cache dtype that suits the machine.

- CUDA: ``bfloat16``, or ``float16`` where the GPU has no native bf16 (before Ampere).
- CPU: ``bfloat16`` when the CPU computes bf16 natively (``avx512_bf16`` or ``amx_bf16`` in its
  flags: Cooper Lake, Sapphire Rapids and later, Zen 4 and later); ``float32`` otherwise, where
  bf16 matmuls are emulated and slower than float32 (measured: about 35-50% fewer output tokens
  per second on an AVX-512 Xeon without AVX512_BF16).
- Anything else: ``float32``.

:func:`choose_dtype` is the pure decision (tested over flag strings); :func:`resolve_dtype`
reads the real machine and passes explicit dtypes through unchanged.
"""

from __future__ import annotations

from pathlib import Path

import torch

AUTO = "auto"
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def choose_dtype(device_kind: str, cpu_flags: str, cuda_bf16: bool) -> tuple[str, str]:
    """The ``auto`` dtype for a device of kind ``device_kind`` (``cpu``, ``cuda``, ...).

    ``cpu_flags``: the CPU's feature flags, whitespace-separated as in ``/proc/cpuinfo``;
    ``cuda_bf16``: whether the GPU computes bfloat16 natively. Returns ``(dtype name, reason)``,
    e.g. ``("bfloat16", "bfloat16 (auto: CPU has avx512_bf16)")``.
    """
    if device_kind == "cuda":
        if cuda_bf16:
            return "bfloat16", "bfloat16 (auto: CUDA GPU supports bf16)"
        return "float16", "float16 (auto: CUDA GPU lacks bf16)"
    if device_kind == "cpu":
        flags = set(cpu_flags.lower().split())
        have = [f for f in NATIVE_BF16_CPU_FLAGS if f in flags]
        if have:
            return "bfloat16", f"bfloat16 (auto: CPU has {' and '.join(have)})"
        return "float32", "float32 (auto: CPU has no native bf16: neither avx512_bf16 nor amx_bf16)"
    return "float32", f"float32 (auto: device {device_kind!r})"


def read_cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The first ``flags`` line of ``/proc/cpuinfo`` (``""`` where there is none, e.g. macOS)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "flags":
                    return value.strip()
    except OSError:
        pass
    return ""


def cuda_supports_bf16(device: torch.device) -> bool:
    """Native bf16 on this CUDA device (emulated bf16, e.g. on a T4, does not count)."""
    with torch.cuda.device(device):
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # older torch: no emulation switch
            return bool(torch.cuda.is_bf16_supported())


def resolve_dtype(requested: str, device: torch.device) -> tuple[str, str]:
    """``(dtype name, reason)`` for ``model.dtype = requested`` on ``device``.

    An explicit dtype is returned as is (reason ``"float32 (configured)"``); ``auto`` is
    decided by :func:`choose_dtype` over this machine's CPU flags or its GPU.
    """
    if requested != AUTO:
        return requested, f"{requested} (configured)"
    if device.type == "cuda":
        return choose_dtype("cuda", "", cuda_supports_bf16(device))
    flags = read_cpu_flags() if device.type == "cpu" else ""
    return choose_dtype(device.type, flags, False)
