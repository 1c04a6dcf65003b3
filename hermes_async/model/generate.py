"""One-shot generation straight on the runner (no engine, no prefix cache): the smoke path of
``hermes-async generate`` and a reference for what the engine must reproduce.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from hermes_async.model.runner import ModelRunner
from hermes_async.types import SequenceStep


def generate_ids(runner: ModelRunner, prompt_ids: list[int], max_new_tokens: int,
                 stop_ids: set[int], temperature: float = 0.0,
                 seed: int | None = None) -> Iterator[int]:
    """Yield new token ids one at a time (greedy when ``temperature`` is 0) until a stop id or
    ``max_new_tokens``; the stop id itself is not yielded. Uses blocks ``0..n`` of the pool."""
    total = min(len(prompt_ids) + max_new_tokens, runner.max_model_len)
    blocks = -(-total // runner.block_size)
    if blocks > runner.num_blocks:
        raise ValueError(f"{total} tokens need {blocks} KV blocks; the pool has "
                         f"{runner.num_blocks}")
    table = tuple(range(blocks))
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    logits = runner.forward([SequenceStep(table, 0, tuple(prompt_ids))])[0]
    pos = len(prompt_ids)
    while pos < total:
        if temperature > 0:
            probs = torch.softmax(logits.cpu() / temperature, dim=-1)
            tok = int(torch.multinomial(probs, 1, generator=gen))
        else:
            tok = int(logits.argmax())
        if tok in stop_ids:
            return
        yield tok
        if pos + 1 >= total:
            return
        logits = runner.forward([SequenceStep(table, pos, (tok,))])[0]
        pos += 1
