"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The converted default model (SmolLM2-135M-Instruct, float32) in the real hermes home
    (``$HERMES_HOME``, else the XDG cache), so every test session and CI run reuses one
    conversion. Converts on first use (about half a minute on two cores). Read-only: do not
    modify files inside it."""
    from hermes_async.model.default_model import fetch_default_model

    return fetch_default_model()
