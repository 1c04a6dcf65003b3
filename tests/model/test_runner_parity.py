"""Parity of the paged runner with transformers' own model class (the oracle), float32 (float16
on flashinfer, which has no float32 kernels: tolerances from conftest.parity_tolerance)."""

from __future__ import annotations

import random

import pytest
import torch

from hermes_async.step import SequenceStep
from tests.model.conftest import (
    KERNEL_HEAD_DIM,
    BlockAllocator,
    fast_code_paths,
    make_runner,
    parity_tolerance,
)

TOL = 1e-3


def prompt(n: int, seed: int, vocab: int = 320) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def oracle_last_logits(oracle, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return oracle(torch.tensor([ids])).logits[0, -1].float()


def blocks_for(n_tokens: int, bs: int) -> int:
    return -(-n_tokens // bs)


def test_full_prefill_matches_transformers(tiny_case, oracle_for):
    path, backend = tiny_case
    runner = make_runner(path, backend=backend)
    bs = runner.block_size
    alloc = BlockAllocator(runner.num_blocks)
    # below, at and past block boundaries; past mistral's window
    for n in sorted({1, 7, bs - 1, bs, bs + 1, 61}):
        ids = prompt(n, seed=n)
        table = tuple(alloc.take(blocks_for(n, runner.block_size)))
        ours = runner.forward([SequenceStep(table, 0, tuple(ids))])[0].cpu()
        ref = oracle_last_logits(oracle_for(path), ids)
        assert (ours - ref).abs().max().item() < parity_tolerance(runner, ref), n


def test_prefill_after_cached_blocks_equals_full_prefill(tiny_case):
    path, backend = tiny_case
    runner = make_runner(path, backend=backend)
    bs = runner.block_size
    alloc = BlockAllocator(runner.num_blocks, seed=1)
    n = 6 * bs + 5
    ids = prompt(n, seed=3)
    full_table = tuple(alloc.take(blocks_for(n, bs)))
    full = runner.forward([SequenceStep(full_table, 0, tuple(ids))])[0]
    for k in (1, 3, 6):  # cached blocks written by an earlier step
        table = tuple(alloc.take(blocks_for(n, bs)))
        runner.forward([SequenceStep(table, 0, tuple(ids[: k * bs]))])
        resumed = runner.forward([SequenceStep(table, k * bs, tuple(ids[k * bs:]))])[0]
        assert (resumed - full).abs().max().item() < parity_tolerance(runner, full), k


def test_wrong_block_table_breaks_parity(tiny_dir):
    """The check above is sensitive: reading another sequence's blocks changes the logits."""
    runner = make_runner(tiny_dir)
    bs = runner.block_size
    alloc = BlockAllocator(runner.num_blocks, seed=2)
    ids, other = prompt(40, seed=4), prompt(40, seed=5)
    table, other_table = tuple(alloc.take(5)), tuple(alloc.take(5))
    full = runner.forward([SequenceStep(table, 0, tuple(ids))])[0]
    runner.forward([SequenceStep(other_table, 0, tuple(other))])
    wrong = (other_table[0], other_table[1]) + table[2:]  # first two blocks hold other's K/V
    resumed = runner.forward([SequenceStep(wrong, 2 * bs, tuple(ids[2 * bs:]))])[0]
    assert (resumed - full).abs().max().item() > 10 * TOL
    # (Swapping two cached blocks would not show: K carries its rotary position already and
    # attention over a fully visible prefix is order-free. Reading one block twice does show.)
    repeated = (table[0], table[0]) + table[2:]
    resumed = runner.forward([SequenceStep(repeated, 2 * bs, tuple(ids[2 * bs:]))])[0]
    assert (resumed - full).abs().max().item() > 10 * TOL
    resumed = runner.forward([SequenceStep(table, 2 * bs, tuple(ids[2 * bs:]))])[0]
    assert (resumed - full).abs().max().item() < TOL  # and the right table still agrees


def test_mixed_step_equals_each_sequence_alone(tiny_case):
    path, backend = tiny_case
    runner = make_runner(path, backend=backend)
    bs = runner.block_size
    alloc = BlockAllocator(runner.num_blocks, seed=3)
    # 5 decoding sequences: history already in the pool, one new token each.
    decodes = []
    for i, n in enumerate((5, 8, 17, 30, 47)):
        ids = prompt(n + 1, seed=100 + i)
        table = tuple(alloc.take(blocks_for(n + 1, bs)))
        runner.forward([SequenceStep(table, 0, tuple(ids[:n]))])
        decodes.append(SequenceStep(table, n, (ids[n],)))
    # 3 prefills: fresh, starting after 2 cached blocks, starting after 1 cached block.
    prefills = []
    for i, (n, cached_blocks) in enumerate(((23, 0), (2 * bs + 22, 2), (bs + 4, 1))):
        ids = prompt(n, seed=200 + i)
        table = tuple(alloc.take(blocks_for(n, bs)))
        start = cached_blocks * bs
        if start:
            runner.forward([SequenceStep(table, 0, tuple(ids[:start]))])
        prefills.append(SequenceStep(table, start, tuple(ids[start:])))
    steps = [decodes[0], prefills[0], decodes[1], decodes[2], prefills[1], decodes[3],
             prefills[2], decodes[4]]
    mixed = runner.forward(steps)
    for i, step in enumerate(steps):  # rerunning alone rewrites identical K/V: idempotent
        alone = runner.forward([step])[0]
        assert (mixed[i] - alone).abs().max().item() < parity_tolerance(runner, alone), i


def greedy_with_runner(runner, ids: list[int], new_tokens: int) -> list[int]:
    bs = runner.block_size
    table = tuple(BlockAllocator(runner.num_blocks, seed=9).take(
        blocks_for(len(ids) + new_tokens, bs)))
    logits = runner.forward([SequenceStep(table, 0, tuple(ids))])[0]
    out = []
    for _ in range(new_tokens):
        tok = int(logits.argmax().item())
        out.append(tok)
        pos = len(ids) + len(out) - 1
        logits = runner.forward([SequenceStep(table, pos, (tok,))])[0]
    return out


def test_greedy_generation_matches_transformers_generate(tiny_case, oracle_for):
    path, backend = tiny_case
    runner = make_runner(path, backend=backend)
    ids = prompt(19, seed=7)
    ours = greedy_with_runner(runner, ids, 48)
    oracle = oracle_for(path)
    with torch.no_grad():
        ref = oracle.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    assert ours == ref


@pytest.mark.parametrize("bad", ["short_table", "out_of_pool", "empty", "too_long"])
def test_bad_steps_raise_clear_errors(tiny_dir, bad):
    from hermes_async.model.runner import StepError

    runner = make_runner(tiny_dir)
    steps = {
        "short_table": SequenceStep((0,), 0, tuple(range(3, 20))),
        "out_of_pool": SequenceStep((runner.num_blocks,), 0, (5, 6)),
        "empty": SequenceStep((0,), 0, ()),
        "too_long": SequenceStep(tuple(range(200)), 0, (5,) * 1025),
    }
    with pytest.raises(StepError):
        runner.forward([steps[bad]])


@pytest.mark.parametrize("backend", ["torch", *fast_code_paths("bfloat16")])
def test_bfloat16_decode_path_agrees_with_prefill(tiny_models, backend):
    """bfloat16 on the CPU decodes through the matmul path (torch) or the kernels; it must
    agree with a prefill."""
    path = tiny_models("llama", 16 if backend == "torch" else KERNEL_HEAD_DIM)
    runner = make_runner(path, dtype="bfloat16", backend=backend)
    alloc = BlockAllocator(runner.num_blocks, seed=4)
    seqs = [prompt(n, seed=300 + n) for n in (9, 26, 40)]
    tables = [tuple(alloc.take(blocks_for(len(s), runner.block_size))) for s in seqs]
    full = runner.forward([SequenceStep(t, 0, tuple(s)) for t, s in zip(tables, seqs, strict=True)])
    for t, s in zip(tables, seqs, strict=True):
        runner.forward([SequenceStep(t, 0, tuple(s[:-1]))])
    decoded = runner.forward([SequenceStep(t, len(s) - 1, (s[-1],)) for t, s in
                              zip(tables, seqs, strict=True)])
    scale = full.abs().max().item()
    assert (decoded - full).abs().max().item() < 0.02 * scale


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cascade_decodes_over_shared_blocks_equal_each_alone(tiny_dir, dtype):
    """Decodes that share cached blocks (two groups, as under two system prompts) attend to
    the shared prefix together; each must equal the same decode run alone (plain path)."""
    runner = make_runner(tiny_dir, dtype=dtype)
    bs = runner.block_size
    alloc = BlockAllocator(runner.num_blocks, seed=6)
    steps = []
    for g, n_shared in enumerate((5, 3)):
        shared_ids = prompt(n_shared * bs, seed=400 + g)
        shared_table = tuple(alloc.take(n_shared))
        runner.forward([SequenceStep(shared_table, 0, tuple(shared_ids))])
        for i in range(4 if g == 0 else 3):
            own = prompt(3 + 7 * i, seed=500 + 10 * g + i)
            total = len(shared_ids) + len(own) + 1
            table = shared_table + tuple(alloc.take(blocks_for(total, bs) - n_shared))
            runner.forward([SequenceStep(table, len(shared_ids), tuple(own))])
            steps.append(SequenceStep(table, total - 1, (own[-1] + 1,)))
    lone = prompt(20, seed=600)  # a decode sharing nothing, and a prefill, in the same step
    lone_table = tuple(alloc.take(blocks_for(21, bs)))
    runner.forward([SequenceStep(lone_table, 0, tuple(lone))])
    steps.append(SequenceStep(lone_table, 20, (9,)))
    fresh = prompt(30, seed=601)
    steps.insert(3, SequenceStep(tuple(alloc.take(blocks_for(30, bs))), 0, tuple(fresh)))
    groups = runner.attention.order(steps).hint
    assert groups == [(4, 5), (3, 3)]  # grouped, sharing 5 and 3 blocks
    mixed = runner.forward(steps)
    tol = TOL if dtype == "float32" else 0.03 * mixed.abs().max().item()
    for i, step in enumerate(steps):
        alone = runner.forward([step])[0]
        assert (mixed[i] - alone).abs().max().item() < tol, i
