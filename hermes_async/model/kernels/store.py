"""Cached verdicts, so that a normal start pays nothing for the probes.

One JSON file per verdict under ``<hermes home>/kernels/verdicts/``, named by the digest of
everything the outcome depends on (:meth:`VerdictStore.key`): the path and its options, the
model's shapes and dtype, the CPU's flags, the torch version, the contents of the libraries the
path runs and of the probe's code. Any of them changing is a new key: probed again. Files are
written atomically (temp + rename); an unreadable one is a miss.

A file's content digest is computed once per store and remembered on disk by (path, size,
mtime) in ``digests.json``: vLLM's library is 200 MB (0.4 s of sha256), shared by several
paths, and a start with unchanged libraries reads it not at all.
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

DIGESTS_FILE = "digests.json"


def default_dir() -> Path:
    from hermes_async.model.default_model import hermes_home

    return hermes_home() / "kernels" / "verdicts"


def probe_files(probe: str) -> list[Path]:
    """The probe's module and this package's files (the shared probe machinery)."""
    files = sorted(Path(__file__).parent.glob("*.py"))
    try:
        found = importlib.util.find_spec(probe.partition(":")[0])
    except (ImportError, ValueError):
        found = None
    if found is not None and found.origin:
        files.append(Path(found.origin))
    return files


class VerdictStore:
    """Verdicts on disk, by key; a store that cannot be written keeps working (misses)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or default_dir()
        self._digests: dict[str, str] | None = None  # "path|size|mtime_ns" -> sha256

    def digest(self, path: Path) -> str:
        """sha256 of a file's contents (``missing`` where it cannot be read), remembered by
        its path, size and modification time."""
        try:
            st = path.stat()
        except OSError:
            return "missing"
        if self._digests is None:
            self._digests = self._read_json(DIGESTS_FILE) or {}
        ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        if ident not in self._digests:
            try:
                with open(path, "rb") as f:
                    self._digests[ident] = hashlib.file_digest(f, "sha256").hexdigest()
            except OSError:
                return "missing"
            self._write_json(DIGESTS_FILE, self._digests)
        return self._digests[ident]

    def key(self, path: KernelPath, shapes: ProbeShapes, cpu_flags: str) -> str:
        """The verdict's key: a digest of everything its outcome depends on."""
        code = "".join(self.digest(p) for p in probe_files(path.probe))
        parts = {
            "path": path.to_json(),
            "shapes": shapes.to_json(),
            "cpu": " ".join(sorted(cpu_flags.split())),
            "torch": torch.__version__,
            "libraries": {str(p): self.digest(p) for p in path.libraries},
            "probe": hashlib.sha256(code.encode()).hexdigest(),
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]

    def get(self, key: str) -> Verdict | None:
        data = self._read_json(f"{key}.json")
        try:
            return None if data is None else Verdict.from_json(data, cached=True)
        except (ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, verdict: Verdict) -> None:
        self._write_json(f"{key}.json", verdict.to_json())

    def _read_json(self, name: str) -> dict | None:
        try:
            data = json.loads((self.directory / name).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write_json(self, name: str, data: dict) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.directory / name)
        except OSError:
            pass
