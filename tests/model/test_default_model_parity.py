"""The runner on the real default model (SmolLM2-135M-Instruct) against transformers, float32
(float16 on flashinfer), with every attention backend that runs here."""

from __future__ import annotations

import pytest
import torch

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.runner import ModelRunner
from hermes_async.step import SequenceStep
from tests.model.conftest import device_under_test, fast_code_paths, parity_dtype, parity_tolerance
from tests.model.test_runner_parity import greedy_with_runner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def oracle_and_tokenizer(default_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    oracle = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    return oracle, AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="module", params=["torch", *fast_code_paths()])
def real(request, default_model_dir, oracle_and_tokenizer):
    runner = ModelRunner(default_model_dir,
                         ModelConfig(dtype=parity_dtype(request.param),
                                     device=device_under_test(),
                                     attention_backend=request.param),
                         CacheConfig(kv_cache_bytes=64 << 20))
    return runner, *oracle_and_tokenizer


def chat_ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                              add_generation_prompt=True, tokenize=True,
                                              return_dict=False))


def test_prefill_logits_match_transformers(real):
    runner, oracle, tokenizer = real
    ids = chat_ids(tokenizer, "Explain in two sentences why the sky is blue.")
    table = tuple(range(-(-len(ids) // runner.block_size)))
    ours = runner.forward([SequenceStep(table, 0, tuple(ids))])[0].cpu()
    with torch.no_grad():
        ref = oracle(torch.tensor([ids])).logits[0, -1]
    assert (ours - ref).abs().max().item() < parity_tolerance(runner, ref)


def test_greedy_48_tokens_match_generate(real):
    runner, oracle, tokenizer = real
    ids = chat_ids(tokenizer, "Explain in detail how a car engine works.")
    ours = greedy_with_runner(runner, ids, 48)
    with torch.no_grad():
        ref = oracle.generate(torch.tensor([ids]), max_new_tokens=48,
                              do_sample=False)[0, len(ids):].tolist()
    assert len(ref) == 48, "the prompt should not let the reference stop early"
    assert ours == ref
    assert tokenizer.decode(ours, skip_special_tokens=True).strip()
