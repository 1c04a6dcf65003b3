from __future__ import annotations

import os
import random

import pytest

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.runner import ModelRunner
from tests.tiny_models import load_oracle, make_tiny_model


class BlockAllocator:
    """Hands out distinct, shuffled block ids so tables are never accidentally contiguous."""

    def __init__(self, num_blocks: int, seed: int = 0) -> None:
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)

    def take(self, n: int) -> list[int]:
        out, self.free = self.free[:n], self.free[n:]
        assert len(out) == n, "test pool too small"
        return out


@pytest.fixture(scope="session", params=["llama", "qwen2", "mistral"])
def tiny_arch_dir(request, tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("llama"), "llama")


def device_under_test() -> str:
    """``HERMES_TEST_DEVICE=cuda`` runs the runner tests on a GPU (scripts/device_check.sh)."""
    return os.environ.get("HERMES_TEST_DEVICE", "cpu")


def make_runner(path, block_size: int = 8, dtype: str = "float32") -> ModelRunner:
    return ModelRunner(
        path,
        ModelConfig(dtype=dtype, device=device_under_test()),
        CacheConfig(block_size=block_size, kv_cache_bytes=4 << 20),
    )


@pytest.fixture
def oracle_for():
    cache = {}

    def get(path):
        if path not in cache:
            cache[path] = load_oracle(path)
        return cache[path]

    return get
