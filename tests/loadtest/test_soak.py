"""The soak (``loadtest/soak.py``) on the real default model, each run in a subprocess of its
own (its RSS, fds and threads are the soak's alone):

- about two minutes of mixed traffic (``HERMES_SOAK_S`` seconds, default 120) pass every
  check, with eviction, preemption and prefix-cache hits on the way;
- a short run with ``--inject-leak`` (memory and one task per response) fails, and the checks
  that fail are the ones that watch server-loop tasks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SOAK = ROOT / "loadtest" / "soak.py"


def run_soak(model_dir: Path, out_dir: Path, *args: str,
             timeout_s: float) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    cmd = [sys.executable, str(SOAK), "--model", str(model_dir), "--out-dir", str(out_dir),
           *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    print(proc.stdout)  # the summary table, shown by pytest on failure or with -s
    report_path = out_dir / "soak.json"
    assert report_path.is_file(), f"no report (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    return proc, json.loads(report_path.read_text())


def failed(report: dict[str, Any]) -> list[str]:
    return [c["name"] for c in report["checks"] if not c["ok"]]


def test_soak_passes(default_model_dir: Path, tmp_path: Path) -> None:
    duration = float(os.environ.get("HERMES_SOAK_S", "120"))
    warmup = min(30.0, duration / 4)
    proc, report = run_soak(default_model_dir, tmp_path, "--duration-s", str(duration),
                            "--warmup-s", str(warmup), "--finish-s", "3",
                            timeout_s=duration + 300)
    assert proc.returncode == 0 and report["passed"], \
        f"failed checks: {failed(report)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "SOAK PASSED" in proc.stdout
    assert (tmp_path / "soak.png").read_bytes().startswith(b"\x89PNG")
    traffic, counters = report["traffic"], report["counters"]
    assert traffic["classes"].get("2xx") and traffic["classes"].get("4xx")
    assert not traffic["classes"].get("5xx")
    assert traffic["vanished"] > 0
    assert counters["evicted_blocks"] > 0 and counters["prefix_hit_tokens"] > 0
    if duration >= 100:  # enough traffic that every kind ran and the pool overflowed
        assert set(traffic["kinds"]) >= {"chat_stream", "vanish", "chat", "n_choices", "stop",
                                         "completion", "bad_request"}
        assert counters["preemptions"] > 0
    assert len([s for s in report["samples"] if s["phase"] == "soak"]) >= 3


def test_soak_detects_an_injected_leak(default_model_dir: Path, tmp_path: Path) -> None:
    # a short grace: the leaked tasks never go away, so the drain would wait it out
    proc, report = run_soak(default_model_dir, tmp_path, "--inject-leak", "--duration-s", "40",
                            "--warmup-s", "10", "--finish-s", "3", "--grace-s", "5",
                            timeout_s=300)
    assert proc.returncode == 1 and not report["passed"], proc.stdout[-3000:]
    assert "SOAK FAILED" in proc.stdout
    names = failed(report)
    assert "trend tasks" in names and "drain: tasks back to baseline" in names, names
    # the leak is the only thing wrong: traffic, answers and the engine are fine
    assert not set(names) & {"no 5xx", "greedy answer unchanged", "drain: engine.check_integrity()",
                             "drain: queues and held KV blocks at 0", "no anomalies in answers"}
