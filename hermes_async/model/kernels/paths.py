"""What a kernel probe proves: one fast path (:class:`KernelPath`) and its outcome.

A fast path is anything that can compute wrong numbers or kill the process: an attention
backend's code path (``vllm-cpu:amx``, ``vllm-cpu:vec``, ``native-cpu``), or one family of the
decoder's other ops (``onednn-linear``, ``vllm-fused-ops``, ``native-gemv``, ``native-silu``).
Its probe is a function named by import path (``"module:function"``), called in a child
process as ``probe(shapes, **options)``; it runs the kernel on the model's shapes against a
float64 reference and returns a :class:`ProbeReport` (or raises: a refusal with the error).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ATTENTION = "attention"
LAYER_OP = "layer op"


@dataclass(frozen=True)
class KernelPath:
    """One fast path: ``name`` (unique), ``kind`` (:data:`ATTENTION` or :data:`LAYER_OP`),
    the probe's import path and keyword options, and the library files whose contents key
    its verdict (a rebuilt or upgraded library is probed again)."""

    name: str
    kind: str
    probe: str
    options: tuple[tuple[str, str], ...] = ()
    libraries: tuple[Path, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "probe": self.probe,
                "options": [list(kv) for kv in self.options]}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> KernelPath:
        options = tuple((str(k), str(v)) for k, v in data["options"])  # type: ignore[union-attr,misc]
        return cls(str(data["name"]), str(data["kind"]), str(data["probe"]), options)


class NotApplicable(Exception):  # noqa: N818 - a probe's answer, not a failure
    """Raised by a probe whose path would not run for these shapes or on this CPU at all
    (e.g. a bfloat16-only kernel in a float32 model): not admitted, and not a fault."""


@dataclass(frozen=True)
class ProbeReport:
    """What a probe measured: the largest error against the reference, the tolerance it was
    held to, and what ran (cases, the implementation a library reported)."""

    max_error: float
    tolerance: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.max_error <= self.tolerance


@dataclass(frozen=True)
class Verdict:
    """Whether ``path`` may run here, and why (``reason``: what passed, or the refusal:
    the signal that killed the probe, the hang, the error or the wrong numbers)."""

    name: str
    kind: str
    ok: bool
    reason: str
    seconds: float = 0.0
    cached: bool = False
    extra: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "ok": self.ok, "reason": self.reason,
                "seconds": self.seconds, "extra": self.extra}

    @classmethod
    def from_json(cls, data: dict[str, object], cached: bool = False) -> Verdict:
        return cls(str(data["name"]), str(data["kind"]), bool(data["ok"]), str(data["reason"]),
                   float(data.get("seconds", 0.0)), cached,  # type: ignore[arg-type]
                   dict(data.get("extra") or {}))  # type: ignore[call-overload]


def resolve(ref: str) -> Callable[..., object]:
    """The object an import path ``"package.module:attribute"`` names."""
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"not an import path 'module:attribute': {ref!r}")
    obj: object = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[return-value]
