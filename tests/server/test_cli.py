"""``hermes-async serve`` as a user runs it: a process that prints its URL, serves the
embedded default model, requires the ``--api-key`` given, and stops cleanly on SIGINT."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.server.helpers import request, request_json

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_serve_prints_url_serves_and_stops(default_model_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes_async", "serve", "--config",
         str(ROOT / "configs" / "cpu-small.toml"), "--port", "0", "--api-key", "sk-test",
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True
                     ).start()
    try:
        first = lines.get(timeout=60)
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", first)
        assert m, first
        url = m[1]
        deadline = time.monotonic() + 120
        while request(f"{url}/health")[0] != 200:
            assert time.monotonic() < deadline and proc.poll() is None, "never became ready"
            time.sleep(0.2)
        assert "ready" in lines.get(timeout=10)
        body = {"model": "SmolLM2-135M-Instruct", "max_tokens": 3,
                "messages": [{"role": "user", "content": "Hi"}]}
        assert request_json(f"{url}/v1/chat/completions", body)[0] == 401
        status, _, res = request_json(f"{url}/v1/chat/completions", body,
                                      headers={"Authorization": "Bearer sk-test"})
        assert status == 200 and res["usage"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
