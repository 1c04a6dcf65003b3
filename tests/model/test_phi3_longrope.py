"""Phi-3 ``longrope`` against transformers' ``Phi3ForCausalLM``, on every CPU backend (the
fused rotary kernel reads one position-indexed table: short rows, then long ones).

Below ``original_max_position_embeddings`` both use the short factors: greedy answers equal
transformers'. Past it, transformers' ``generate`` drops its cache once and recomputes the whole
sequence with the long factors; hermes rotates each token by its own position (long from the
original length on) and keeps the keys it wrote, as transformers' model does step by step when
its cache is kept: that is the oracle there (its ``prepare_inputs_for_generation`` without the
cache reset). The long factors bite: with the short ones alone the "past" case's logits differ
from the oracle's by about 6 at the first position past the switch (random factors 4-16)."""

from __future__ import annotations

import random

import pytest
import torch

from hermes_async.step import SequenceStep
from tests.model.conftest import KERNEL_HEAD_DIM, BlockAllocator, fast_code_paths, make_runner
from tests.tiny_models import COMMON

ORIGINAL = 32  # original_max_position_embeddings: the switch


PARTIAL = 0.75  # Phi-4-mini's partial_rotary_factor: a quarter of each head is not rotated


@pytest.fixture(scope="module", params=[1.0, PARTIAL], ids=["phi3", "phi4-mini-partial"])
def longrope_dir(tmp_path_factory, request):
    import transformers as tf

    torch.manual_seed(0)
    rng = random.Random(0)
    half = int(KERNEL_HEAD_DIM * request.param) // 2
    rope = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [rng.uniform(1.0, 1.5) for _ in range(half)],
            "long_factor": [rng.uniform(4.0, 16.0) for _ in range(half)],
            "original_max_position_embeddings": ORIGINAL,
            "partial_rotary_factor": request.param}
    heads = COMMON["num_attention_heads"]  # Phi-3's head size is hidden / heads
    cfg = tf.Phi3Config(**{**COMMON, "hidden_size": heads * KERNEL_HEAD_DIM,
                           "head_dim": KERNEL_HEAD_DIM,
                           "max_position_embeddings": 4 * ORIGINAL},
                        tie_word_embeddings=False, sliding_window=None, rope_parameters=rope,
                        original_max_position_embeddings=ORIGINAL)
    model = tf.Phi3ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.15) if p.dim() >= 2 else p.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("phi3-longrope")
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("keep_cache", [False, True], ids=["below", "past"])
@pytest.mark.parametrize("backend", ["torch", *fast_code_paths()])
def test_longrope_greedy_answers(longrope_dir, backend, keep_cache):
    from transformers import AutoModelForCausalLM, Phi3ForCausalLM

    oracle = AutoModelForCausalLM.from_pretrained(longrope_dir, dtype=torch.float32).eval()
    if keep_cache:  # the step-by-step oracle past the switch (module docstring)
        oracle.prepare_inputs_for_generation = super(
            Phi3ForCausalLM, oracle).prepare_inputs_for_generation
    runner = make_runner(longrope_dir, backend=backend)
    assert runner.spec.rope_switch_position == ORIGINAL
    factor = oracle.config.rope_parameters.get("partial_rotary_factor", 1.0)
    assert runner.spec.rotary_dim == int(KERNEL_HEAD_DIM * factor)
    rng = random.Random(1)
    prompt = [rng.randrange(3, 320) for _ in range(12)]
    new = 3 * ORIGINAL - len(prompt) if keep_cache else ORIGINAL - len(prompt)
    with torch.no_grad():
        want = oracle.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    alloc = BlockAllocator(runner.num_blocks)
    table = tuple(alloc.take(-(-(len(prompt) + new) // runner.block_size)))
    seq, got = list(prompt), []
    step = SequenceStep(table, 0, tuple(seq))
    for _ in range(new):
        token = int(runner.forward([step])[0].argmax())
        got.append(token)
        step = SequenceStep(table, len(seq), (token,))
        seq.append(token)
    assert got == want


@pytest.mark.parametrize("backend", ["torch", *fast_code_paths()])
def test_partial_rotary_without_scaling(tmp_path, backend):
    """Partial rotary with the default RoPE: fp32 logits of a prefill and of decodes after it
    equal transformers' within 1e-3; the unrotated part matters (rotating the whole head moves
    the logits by far more)."""
    import transformers as tf

    torch.manual_seed(3)
    heads = COMMON["num_attention_heads"]
    cfg = tf.Phi3Config(**{**COMMON, "hidden_size": heads * KERNEL_HEAD_DIM,
                           "head_dim": KERNEL_HEAD_DIM, "max_position_embeddings": 256},
                        tie_word_embeddings=False, sliding_window=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                         "partial_rotary_factor": 0.5})
    model = tf.Phi3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.15) if p.dim() >= 2 else p.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path)
    full = tf.Phi3ForCausalLM(tf.Phi3Config(**{**cfg.to_dict(), "rope_parameters": {
        "rope_type": "default", "rope_theta": 500.0}})).eval()
    full.load_state_dict(model.state_dict())
    runner = make_runner(tmp_path, backend=backend)
    assert runner.spec.rotary_dim == KERNEL_HEAD_DIM // 2
    rng = random.Random(4)
    ids = [rng.randrange(3, 320) for _ in range(40)]
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0]
        assert (full(torch.tensor([ids])).logits[0] - want).abs().max() > 0.05
    alloc = BlockAllocator(runner.num_blocks)
    table = tuple(alloc.take(-(-len(ids) // runner.block_size)))
    prefill = runner.forward([SequenceStep(table, 0, tuple(ids[:32]))])[0]
    torch.testing.assert_close(prefill.float(), want[31], atol=1e-3, rtol=0)
    for pos in range(32, len(ids)):
        got = runner.forward([SequenceStep(table, pos, (ids[pos],))])[0]
        torch.testing.assert_close(got.float(), want[pos], atol=1e-3, rtol=0)
