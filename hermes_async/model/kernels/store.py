"""Cached verdicts, so that a normal start pays nothing for the probes.

One JSON file per verdict under ``<hermes home>/kernels/verdicts/``, named by the digest of
everything the outcome depends on (:func:`verdict_key`): the path and its options, the model's
shapes and dtype, the CPU's flags, the torch version, the contents of the libraries the path
runs and of the probe's code. Any of them changing is a new key: probed again. Files are
written atomically (temp + rename); an unreadable one is a miss.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path

import torch

from hermes_async.model.kernels.paths import KernelPath, Verdict
from hermes_async.model.kernels.shapes import ProbeShapes


def default_dir() -> Path:
    from hermes_async.model.default_model import hermes_home

    return hermes_home() / "kernels" / "verdicts"


def file_digest(path: Path) -> str:
    """sha256 of a file's contents (``missing`` where it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return "missing"


def probe_code_digest(probe: str) -> str:
    """Digest of the probe's module and of this package (the shared probe machinery)."""
    files = sorted(Path(__file__).parent.glob("*.py"))
    module = probe.partition(":")[0]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is not None and found.origin:
        files.append(Path(found.origin))
    return hashlib.sha256("".join(file_digest(p) for p in files).encode()).hexdigest()


def verdict_key(path: KernelPath, shapes: ProbeShapes, cpu_flags: str) -> str:
    parts = {
        "path": path.to_json(),
        "shapes": shapes.to_json(),
        "cpu": " ".join(sorted(cpu_flags.split())),
        "torch": torch.__version__,
        "libraries": {str(p): file_digest(p) for p in path.libraries},
        "probe": probe_code_digest(path.probe),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


class VerdictStore:
    """Verdicts on disk, by key; a store that cannot be written keeps working (misses)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or default_dir()

    def get(self, key: str) -> Verdict | None:
        try:
            data = json.loads((self.directory / f"{key}.json").read_text())
            return Verdict.from_json(data, cached=True)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, verdict: Verdict) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(verdict.to_json(), f)
            os.replace(tmp, self.directory / f"{key}.json")
        except OSError:
            pass
