"""Fixtures of the HTTP tests (see ``helpers`` for the server thread)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.helpers import ServerThread, real_config


@pytest.fixture(scope="session")
def server(default_model_dir: Path):
    """One real server without API keys (default model), shared by the end-to-end modules."""
    srv = ServerThread(real_config(default_model_dir)).start()
    yield srv
    srv.stop()
