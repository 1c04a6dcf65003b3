"""``model.dtype = "auto"``: the decision over device kinds and CPU-flag strings, the machine
reader, and the runner's resolved dtype (explicit dtypes unchanged)."""

from __future__ import annotations

import logging

import pytest
import torch

from hermes_async.config import ConfigError, ModelConfig
from hermes_async.model import dtype as dtype_mod
from hermes_async.model.dtype import choose_dtype, read_cpu_flags, resolve_dtype
from tests.model.conftest import make_runner

# Abridged /proc/cpuinfo flag lines of real CPUs.
SKYLAKE_X = "fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma avx512f avx512dq avx512cd " \
            "avx512bw avx512vl avx512_vnni"  # AVX-512, no bf16: the slow-bf16 case
COOPER_LAKE = SKYLAKE_X + " avx512_bf16"
SAPPHIRE_RAPIDS = COOPER_LAKE + " amx_bf16 amx_tile amx_int8 avx512_fp16"
ZEN4 = "fpu sse2 avx avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_vbmi2"
LAPTOP = "fpu sse2 ssse3 sse4_2 avx avx2 fma f16c"


@pytest.mark.parametrize(("flags", "expected"), [
    (SKYLAKE_X, ("float32",
                 "float32 (auto: CPU has no native bf16: neither avx512_bf16 nor amx_bf16)")),
    (LAPTOP, ("float32",
              "float32 (auto: CPU has no native bf16: neither avx512_bf16 nor amx_bf16)")),
    ("", ("float32", "float32 (auto: CPU has no native bf16: neither avx512_bf16 nor amx_bf16)")),
    (COOPER_LAKE, ("bfloat16", "bfloat16 (auto: CPU has avx512_bf16)")),
    (ZEN4, ("bfloat16", "bfloat16 (auto: CPU has avx512_bf16)")),
    (SAPPHIRE_RAPIDS, ("bfloat16", "bfloat16 (auto: CPU has avx512_bf16 and amx_bf16)")),
    ("fpu amx_bf16 amx_tile", ("bfloat16", "bfloat16 (auto: CPU has amx_bf16)")),
])
def test_cpu_decision_follows_native_bf16_flags(flags, expected):
    assert choose_dtype("cpu", flags, False) == expected
    assert choose_dtype("cpu", flags, True) == expected  # a GPU's bf16 says nothing of the CPU


@pytest.mark.parametrize("flags", [
    "avx512bw avx512_vnni avx512_fp16",  # names that only contain "bf16"-like parts
    "avx512_bf16x", "xamx_bf16", "avx512bf16",  # near misses are whole-word mismatches
])
def test_cpu_flags_are_matched_as_whole_words(flags):
    assert choose_dtype("cpu", flags, False)[0] == "float32"


def test_cpu_flags_tolerate_case_and_whitespace():
    assert choose_dtype("cpu", "  AVX2\tAVX512_BF16\n", False)[0] == "bfloat16"


def test_cuda_decision_follows_gpu_bf16():
    assert choose_dtype("cuda", "", True) == ("bfloat16", "bfloat16 (auto: CUDA GPU supports bf16)")
    assert choose_dtype("cuda", "", False) == ("float16", "float16 (auto: CUDA GPU lacks bf16)")
    # the host CPU's flags do not matter on a GPU
    assert choose_dtype("cuda", SAPPHIRE_RAPIDS, False)[0] == "float16"


def test_other_devices_get_float32():
    assert choose_dtype("mps", COOPER_LAKE, True) == ("float32", "float32 (auto: device 'mps')")


def test_read_cpu_flags_takes_the_first_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512_bf16\n"
                    "\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert read_cpu_flags(info) == "fpu avx2 avx512_bf16"
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert read_cpu_flags(tmp_path / "arm") == ""
    assert read_cpu_flags(tmp_path / "missing") == ""


def test_explicit_dtypes_pass_through_unchanged():
    for name in ("float32", "bfloat16", "float16"):
        assert resolve_dtype(name, torch.device("cpu")) == (name, f"{name} (configured)")


@pytest.mark.parametrize(("flags", "expected"), [(SKYLAKE_X, "float32"), (ZEN4, "bfloat16")])
def test_auto_on_cpu_reads_the_machine(monkeypatch, flags, expected):
    monkeypatch.setattr(dtype_mod, "read_cpu_flags", lambda: flags)
    assert resolve_dtype("auto", torch.device("cpu"))[0] == expected


def test_auto_is_the_config_default_and_unknown_names_are_refused():
    assert ModelConfig().dtype == "auto"
    with pytest.raises(ConfigError, match="auto, float32, bfloat16 or float16"):
        ModelConfig(dtype="fp8")


@pytest.mark.parametrize(("flags", "expected", "torch_dtype"), [
    (SKYLAKE_X, "float32", torch.float32), (SAPPHIRE_RAPIDS, "bfloat16", torch.bfloat16)])
def test_runner_resolves_auto_and_logs_it_once(tiny_dir, monkeypatch, caplog, flags, expected,
                                                torch_dtype):
    monkeypatch.setenv("HERMES_TEST_DEVICE", "cpu")
    monkeypatch.setattr(dtype_mod, "read_cpu_flags", lambda: flags)
    with caplog.at_level(logging.INFO, logger="hermes_async.model"):
        runner = make_runner(tiny_dir, dtype="auto")
    assert runner.dtype_name == expected and runner.dtype == torch_dtype
    assert runner.model.embed.dtype == torch_dtype and runner.pool.tensor.dtype == torch_dtype
    lines = [r.getMessage() for r in caplog.records if r.name == "hermes_async.model"
             and r.getMessage().startswith("model dtype")]
    assert lines == [f"model dtype: {runner.dtype_reason}"]
    assert runner.dtype_reason.startswith(f"{expected} (auto: CPU has ")


def test_runner_keeps_an_explicit_dtype(tiny_dir, monkeypatch, caplog):
    monkeypatch.setenv("HERMES_TEST_DEVICE", "cpu")
    monkeypatch.setattr(dtype_mod, "read_cpu_flags", lambda: SAPPHIRE_RAPIDS)
    with caplog.at_level(logging.INFO, logger="hermes_async.model"):
        runner = make_runner(tiny_dir, dtype="float32")
    assert (runner.dtype_name, runner.dtype_reason) == ("float32", "float32 (configured)")
    assert runner.model.embed.dtype == torch.float32
    assert "model dtype: float32 (configured)" in caplog.messages


def test_float16_on_cpu_is_still_refused(tiny_dir, monkeypatch):
    monkeypatch.setenv("HERMES_TEST_DEVICE", "cpu")
    with pytest.raises(ValueError, match="float16 is supported on CUDA only"):
        make_runner(tiny_dir, dtype="float16")
