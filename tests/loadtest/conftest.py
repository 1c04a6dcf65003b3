"""Fixtures of the load-test tests: ``loadtest/`` on ``sys.path`` (its scripts import each
other as ``from workloads import ...``), the default model's tokenizer, one real server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

LOADTEST = Path(__file__).resolve().parents[2] / "loadtest"
if str(LOADTEST) not in sys.path:
    sys.path.insert(0, str(LOADTEST))


@pytest.fixture(scope="session")
def tokenizer(default_model_dir: Path):
    """The default model's tokenizer (local files only)."""
    from workloads import load_tokenizer

    return load_tokenizer(str(default_model_dir))


@pytest.fixture(scope="session")
def loadtest_server(default_model_dir: Path):
    """A real hermes_async server (default model, CPU) for the benchmark and locust runs."""
    from tests.server.helpers import ServerThread, real_config

    srv = ServerThread(real_config(default_model_dir)).start()
    yield srv
    srv.stop()
