"""The locustfile, run headless as a subprocess (locust patches the process with gevent: never
import it here) against a real hermes_async server: it exits 0 and its CSV stats have TTFT and
ITL rows without failures."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def run_locust(url: str, prefix: Path, *classes: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "locust", "-f", "loadtest/locustfile.py", "--headless",
           "-u", "2", "-r", "2", "-t", "8s", "--stop-timeout", "60", "--host", url,
           "--only-summary", "--csv", str(prefix), "--system-tokens", "200",
           "--max-tokens", "6", "--ignore-eos", *classes]
    env = {k: v for k, v in os.environ.items() if k not in ("HERMES_MODEL", "HERMES_API_KEY",
                                                             "OPENAI_API_KEY")}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def test_locust_reports_ttft_and_itl(loadtest_server, tmp_path: Path):
    proc = run_locust(loadtest_server.url, tmp_path / "run", "SharedSystemUser",
                      "ToolCallsUser")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "run_stats.csv", newline="") as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    for kind in ("TTFT", "ITL", "POST"):
        mine = [r for (t, _), r in rows.items() if t == kind]
        assert mine, f"no {kind} rows in {sorted(rows)}"
        assert all(int(r["Failure Count"]) == 0 for r in mine)
        assert sum(int(r["Request Count"]) for r in mine) > 0
    names = {name for t, name in rows if t == "TTFT"}
    assert names == {"chat shared_system", "chat tool_calls"}
    assert int(rows[("", "Aggregated")]["Failure Count"]) == 0
