"""Shared fixtures."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

TRIM_ABOVE_BYTES = 2 << 30


def _rss_bytes() -> int:
    """This process's resident bytes (0 where there is no ``/proc``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None on another C library)."""
    name = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None


@pytest.fixture(autouse=True)
def _return_freed_memory() -> Iterator[None]:
    """After a test that left the process above 2 GiB resident: collect garbage and hand
    glibc's freed heap back to the OS (``malloc_trim``). The suite loads a model per server
    test; glibc keeps freed weights' pages in its heap, and without this the suite's resident
    memory climbs past a 24 GiB machine although nothing is alive (see the
    ``tests/server/test_memory.py`` check that servers are freed)."""
    yield
    if _rss_bytes() < TRIM_ABOVE_BYTES:
        return
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The converted default model (SmolLM2-135M-Instruct, float32) in the real hermes home
    (``$HERMES_HOME``, else the XDG cache), so every test session and CI run reuses one
    conversion. Converts on first use (about half a minute on two cores). Read-only: do not
    modify files inside it."""
    from hermes_async.model.default_model import fetch_default_model

    return fetch_default_model()
