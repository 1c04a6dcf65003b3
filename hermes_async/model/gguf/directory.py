"""The small directory through which a GGUF is served like any Hugging Face directory.

``<hermes home>/models/gguf/<key>/<name>/`` holds ``config.json`` (from the GGUF's metadata,
:mod:`.config`), the tokenizer rebuilt from the file by transformers' GGUF tokenizer builder
(``tokenizer.json``, ``tokenizer_config.json`` with the chat template inline),
``generation_config.json`` (the end-of-turn ids) and :data:`MANIFEST` naming the GGUF; no
weights: the loader reads them from the GGUF (:class:`~.tensors.GGUFTensors`). ``key`` digests
the file's absolute path, size and mtime, so a changed file gets a new directory; ``name`` is
the served model id (the file's stem unless given). Written into a temporary directory and
renamed into place, the manifest last.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes_async.model.gguf.file import GGUFFile

MANIFEST = "hermes_gguf.json"
FORMAT = 1  # bump when the directory's contents change: older ones are rebuilt


def _source_facts(gguf_path: Path) -> dict[str, Any]:
    st = gguf_path.stat()
    return {"path": str(gguf_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def gguf_file(model_dir: Path) -> GGUFFile | None:
    """The GGUF a prepared directory serves (from the index taken when it was prepared), or
    None for a plain Hugging Face directory. Raises :class:`ModelLoadError` when the GGUF has
    gone or changed since."""
    from hermes_async.model.gguf.file import GGUFFile
    from hermes_async.model.spec import ModelLoadError

    manifest = model_dir / MANIFEST
    if not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        path = Path(data["source"]["path"])
        recorded = data["source"]
        index = data["index"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"cannot read {manifest}: {e}") from e
    try:
        current = _source_facts(path)
    except OSError as e:
        raise ModelLoadError(f"{model_dir} serves {path}, which cannot be read: {e}") from e
    if current != recorded:
        raise ModelLoadError(f"{path} changed since {model_dir} was prepared; "
                             "serve the file again to rebuild it")
    return GGUFFile.from_index(path, index)


def _complete(model_dir: Path, source: dict[str, Any]) -> bool:
    try:
        data = json.loads((model_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return data.get("format") == FORMAT and data.get("source") == source


def _target(gguf_path: str | os.PathLike[str], home: Path,
            name: str | None) -> tuple[Path, dict[str, Any]]:
    path = Path(gguf_path).expanduser().resolve()
    try:
        source = _source_facts(path)
    except OSError as e:
        from hermes_async.model.spec import ModelLoadError

        raise ModelLoadError(f"cannot read GGUF file {path}: {e}") from e
    key = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]
    return home / "models" / "gguf" / key / (name or path.stem), source


def prepared_gguf_dir(gguf_path: str | os.PathLike[str], home: Path,
                      name: str | None = None) -> Path | None:
    """The directory of ``gguf_path`` when it is already prepared and current, else None
    (reads one manifest; imports neither torch nor transformers)."""
    final, source = _target(gguf_path, home, name)
    return final if _complete(final, source) else None


def prepare_gguf_dir(gguf_path: str | os.PathLike[str], home: Path,
                     name: str | None = None) -> Path:
    """The directory serving ``gguf_path`` (built once, in about a second plus the tokenizer's
    rebuild). Raises :class:`ModelLoadError` naming the file for an unreadable GGUF or an
    architecture no family reads."""
    final, source = _target(gguf_path, home, name)
    if _complete(final, source):
        return final
    path = Path(source["path"])
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=".build-", dir=parent))
    try:
        _build(path, build, source)
        try:
            os.rename(build, final)
        except OSError:
            if not _complete(final, source):  # a stale one: replace it
                shutil.rmtree(final, ignore_errors=True)
                os.rename(build, final)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return final


def _build(path: Path, out: Path, source: dict[str, Any]) -> None:
    from hermes_async.model.gguf.config import end_of_turn_ids, hf_config
    from hermes_async.model.gguf.file import GGUFFile
    from hermes_async.model.gguf.tokenizer import save_tokenizer

    file = GGUFFile.open(path)
    config = hf_config(file)
    vocab = save_tokenizer(path, out, int(config["max_position_embeddings"]))
    eos = end_of_turn_ids(file, vocab)
    config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", {
        "bos_token_id": config.get("bos_token_id"), "eos_token_id": eos,
        "pad_token_id": config.get("pad_token_id")})
    _write_json(out / MANIFEST, {"format": FORMAT, "source": source,
                                 "architecture": file.arch,
                                 "tensor_types": file.type_counts(),
                                 "tensor_bytes": file.nbytes(), "index": file.index()})
    for p in out.iterdir():
        p.chmod(0o644)
    out.chmod(0o755)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
