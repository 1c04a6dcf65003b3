"""The embedded default model, converted for real (shared ``default_model_dir`` fixture).

Fast tests of the atomic write, corruption and download paths, on a temporary hermes home,
are in ``test_default_model_fetch.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hermes_async.model import default_model, gguf_convert, gguf_source
from hermes_async.model.default_model import MANIFEST_NAME, fetch_default_model, hermes_home

pytestmark = pytest.mark.slow

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    MANIFEST_NAME,
}


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_directory_layout_and_metadata(default_model_dir: Path) -> None:
    assert default_model_dir == hermes_home() / "models" / "SmolLM2-135M-Instruct"
    assert {p.name for p in default_model_dir.iterdir()} >= EXPECTED_FILES
    assert not (default_model_dir / "chat_template.jinja").exists()  # one copy of the template

    config = _read_json(default_model_dir / "config.json")
    assert config["model_type"] == "llama"
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0
    assert config["torch_dtype"] == config["dtype"] == "float32"
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is True

    tok_config = _read_json(default_model_dir / "tokenizer_config.json")
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "<|im_start|>assistant" in tok_config["chat_template"]
    assert tok_config["eos_token"] == "<|im_end|>"
    assert tok_config["clean_up_tokenization_spaces"] is False

    gen = _read_json(default_model_dir / "generation_config.json")
    assert gen["eos_token_id"] == [2, 0]  # <|im_end|>, then <|endoftext|>

    manifest = _read_json(default_model_dir / MANIFEST_NAME)
    assert manifest["source"]["sha256"] == gguf_source.SMOLLM2_GGUF.sha256
    assert manifest["converter_version"] == gguf_convert.CONVERTER_VERSION


def test_converter_version_constants_agree() -> None:
    assert default_model.CONVERTER_VERSION == gguf_convert.CONVERTER_VERSION


def test_transformers_loads_and_generates(default_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir)
    assert model.dtype == torch.float32
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    prompt_len = inputs["input_ids"].shape[1]
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    new = out[0, prompt_len:].tolist()
    text = tokenizer.decode(new, skip_special_tokens=True).strip()
    assert text, "empty completion"
    assert "Paris" in text, text
    assert new[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>"), "did not stop at <|im_end|>"


def test_tokenizer_matches_llama_cpp_smollm_pretokenizer(default_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    assert tok("Hello world, how are you?").input_ids == [19556, 905, 28, 638, 359, 346, 47]
    # Digits are split one by one before the byte-level step (GGUF tokenizer.ggml.pre "smollm"),
    # so the whitespace run before a digit stays one pre-token.
    assert tok.convert_ids_to_tokens(tok("In 2024,  \n8").input_ids) == [
        "In", "Ġ", "2", "0", "2", "4", ",", "ĠĠĊ", "8",
    ]
    chat = [{"role": "user", "content": "hi"}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")  # no extra BOS


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (rotary halves interleaved per head)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape
    )


@pytest.fixture(scope="module")
def gguf_tensors() -> dict:
    """The source GGUF's tensors by name (parsing the file takes a few seconds)."""
    from gguf import GGUFReader

    src = gguf_source.find_gguf(hermes_home(), progress=False)
    return {t.name: t for t in GGUFReader(str(src)).tensors}


@pytest.mark.parametrize(
    ("gguf_name", "hf_name", "n_head"),
    [
        ("token_embd.weight", "model.embed_tokens.weight", None),  # Q8_0
        ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", None),  # Q4_1
        ("blk.3.attn_q.weight", "model.layers.3.self_attn.q_proj.weight", 9),  # Q4_1, permuted
        ("blk.29.attn_k.weight", "model.layers.29.self_attn.k_proj.weight", 3),  # GQA, permuted
        ("output_norm.weight", "model.norm.weight", None),  # F32
    ],
)
def test_weights_equal_gguf_dequantized(
    default_model_dir: Path, gguf_tensors: dict, gguf_name: str, hf_name: str, n_head: int | None
) -> None:
    from gguf import dequantize
    from safetensors import safe_open

    tensor = gguf_tensors[gguf_name]
    expected = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    if n_head is not None:
        expected = _unpermute(expected, n_head)
    with safe_open(str(default_model_dir / "model.safetensors"), "np") as f:
        got = f.get_tensor(hf_name)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)


def test_second_call_is_instant_and_does_not_reconvert(
    default_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("converter called again")

    monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", boom)
    monkeypatch.setattr(default_model, "find_gguf", boom)
    mtimes = {p.name: p.stat().st_mtime_ns for p in default_model_dir.iterdir()}
    started = time.perf_counter()
    assert fetch_default_model() == default_model_dir
    assert time.perf_counter() - started < 0.5
    assert {p.name: p.stat().st_mtime_ns for p in default_model_dir.iterdir()} == mtimes


def test_cached_fetch_in_a_fresh_process_skips_torch() -> None:
    served = default_model.prepare_default_model(progress=False)
    code = (
        "import sys\n"
        "from hermes_async.cli.model import run as cmd_model_fetch\n"
        "import argparse\n"
        "rc = cmd_model_fetch(argparse.Namespace(home=None, quiet=False))\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
        "sys.exit(rc)\n"
    )
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(served)
