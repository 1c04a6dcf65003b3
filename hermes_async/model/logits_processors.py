"""Batched logits transforms used by :mod:`hermes_async.model.sampler`.

Pure tensor functions, one row per sequence, every parameter per row. A row's result depends
only on its own logits and parameters, never on which other rows share the batch. Semantics
follow transformers' processors (the test oracle): ``RepetitionPenaltyLogitsProcessor``,
``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``, ``MinPLogitsWarper``,
applied in that order; frequency/presence penalties follow OpenAI.

Cost: penalties touch only the history's tokens (no ``[batch, vocab]`` count tensors). Rows
with top-k or top-p are filtered and sampled inside a window of their largest logits (a partial
``topk``, not a sort of the vocabulary); only rows with neither pay full-vocabulary passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import numpy as np
import torch

NEG_INF = float("-inf")

# (rows, unnormalised probabilities [rows, width], vocabulary id per column or None = all ids)
Group = tuple[list[int], torch.Tensor, torch.Tensor | None]


def select_rows(t: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """The given (ascending, distinct) rows: ``t`` itself when that is all of them, else a copy."""
    if len(rows) == t.shape[0]:
        return t
    return t.index_select(0, torch.tensor(rows, dtype=torch.long, device=t.device))


def _history_keys(rows: Sequence[int], seqs: Sequence[Iterable[int]], lengths: Sequence[int],
                  vocab: int) -> np.ndarray:
    """Flat ``row * vocab + id`` positions of every in-vocabulary token of each row's history."""
    ids = np.fromiter(chain.from_iterable(seqs), dtype=np.int64, count=sum(lengths))
    row_of = np.repeat(np.asarray(rows, dtype=np.int64), lengths)
    valid = (ids >= 0) & (ids < vocab)
    return row_of[valid] * vocab + ids[valid]


def apply_penalties(logits: torch.Tensor, prompts: Sequence[Sequence[int]],
                    outputs: Sequence[Sequence[int]], repetition: Sequence[float],
                    frequency: Sequence[float], presence: Sequence[float]) -> None:
    """In place on a contiguous ``[n, vocab]`` tensor, each only where not neutral:

    - repetition (HF/vLLM): for tokens in prompt or output, positive logits are divided by the
      penalty, the others multiplied by it;
    - then frequency/presence (OpenAI), over output tokens only:
      ``logit -= frequency * count + presence * (count > 0)``.
    Token ids outside the vocabulary are ignored.
    """
    n, vocab = logits.shape
    flat, dev = logits.view(-1), logits.device
    rep = [i for i in range(n) if repetition[i] != 1.0]
    if rep:
        keys = torch.from_numpy(_history_keys(
            rep, [chain(prompts[i], outputs[i]) for i in rep],
            [len(prompts[i]) + len(outputs[i]) for i in rep], vocab)).to(dev)
        penalty = torch.tensor(repetition, dtype=logits.dtype, device=dev)[keys // vocab]
        values = flat[keys]  # duplicates gather and write back the same value
        flat[keys] = torch.where(values < 0, values * penalty, values / penalty)
    add = [i for i in range(n) if frequency[i] or presence[i]]
    if add:
        keys_np, counts_np = np.unique(_history_keys(
            add, [outputs[i] for i in add], [len(outputs[i]) for i in add], vocab),
            return_counts=True)
        keys = torch.from_numpy(keys_np).to(dev)
        counts = torch.from_numpy(counts_np).to(dev, logits.dtype)
        row = keys // vocab
        freq = torch.tensor(frequency, dtype=logits.dtype, device=dev)[row]
        pres = torch.tensor(presence, dtype=logits.dtype, device=dev)[row]
        flat[keys] -= freq * counts + pres


def ban_tokens(logits: torch.Tensor, banned: Sequence[Iterable[int]]) -> None:
    """Set ``logits[i, t] = -inf`` for every ``t`` in ``banned[i]``, in place (ids outside the
    vocabulary are ignored)."""
    vocab = logits.shape[-1]
    pairs = [(i, t) for i, ids in enumerate(banned) for t in ids if 0 <= t < vocab]
    if pairs:
        index = torch.tensor(pairs, dtype=torch.long).T.to(logits.device)
        logits.index_put_((index[0], index[1]), torch.tensor(NEG_INF, device=logits.device))


def top_window(logits: torch.Tensor, top_k: Sequence[int], top_p: Sequence[float],
               width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k then top-p, computed on each row's ``width`` largest logits.

    top_k: per row; >= vocab disables it, else it must be <= ``width``. Keeps every logit >= the
        k-th largest (``TopKLogitsWarper``).
    top_p: per row; 1.0 disables it. Over the distribution left by top-k, keeps the most likely
        tokens while the mass ranked above the next one is below ``top_p``, so at least the top
        token (``TopPLogitsWarper``'s rule, stated from the top). Ties at the cut-off all stay.
    Returns ``(values, ids, complete)``: the window's logits in descending order with removed
    ones at -inf, their vocabulary ids, and per row whether the window holds every kept token
    (False only for a top-p row without top-k whose nucleus may reach past the window).
    """
    vocab = logits.shape[-1]
    dev = logits.device
    values, ids = torch.topk(logits, width, dim=-1, sorted=True)
    has_k = torch.tensor([k < vocab for k in top_k], device=dev)[:, None]
    if bool(has_k.any()):
        k_idx = torch.tensor([min(k, width) - 1 for k in top_k], device=dev)[:, None]
        k_thr = values.gather(1, k_idx).masked_fill(~has_k, NEG_INF)
        values = values.masked_fill(values < k_thr, NEG_INF)
    complete = torch.ones(len(top_k), dtype=torch.bool, device=dev)
    if all(p >= 1.0 for p in top_p):
        return values, ids, complete
    p = torch.tensor(top_p, dtype=torch.float64, device=dev)[:, None]
    lse = torch.logsumexp(values, dim=-1, keepdim=True)
    if not bool(has_k.all()):  # without top-k the normaliser is the whole row's
        lse = torch.where(has_k, lse, torch.logsumexp(logits, dim=-1, keepdim=True))
    cum = (values - lse).exp().double().cumsum(dim=-1)
    above = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=-1)
    kept = (above < p).sum(dim=-1, keepdim=True)  # >= 1: nothing ranks above the top token
    p_thr = values.gather(1, kept - 1).masked_fill(p >= 1.0, NEG_INF)
    if width < vocab:
        complete = has_k[:, 0] | (kept[:, 0] < width) | (cum[:, -1] >= p[:, 0])
    return values.masked_fill(values < p_thr, NEG_INF), ids, complete


def filtered_probs(logits: torch.Tensor, top_k: Sequence[int | None], top_p: Sequence[float],
                   min_p: Sequence[float], candidates: int) -> list[Group]:
    """Top-k, top-p and min-p on temperature-scaled logits; unnormalised final probabilities.

    Rows are grouped by the window they need (their own ``top_k``; ``candidates`` for top-p
    alone, widened 8x while the nucleus may reach past it; the whole vocabulary, in vocabulary
    order, for rows with neither), so a row's arithmetic never depends on the other rows.
    """
    vocab = logits.shape[-1]
    ks = [vocab if k is None else min(k, vocab) for k in top_k]
    pending: dict[int, list[int]] = {}
    full: list[int] = []
    for i, (k, p) in enumerate(zip(ks, top_p, strict=True)):
        if k < vocab or p < 1.0:
            pending.setdefault(k if k < vocab else min(candidates, vocab), []).append(i)
        else:
            full.append(i)
    groups: list[Group] = []
    if full:
        probs = torch.softmax(select_rows(logits, full), dim=-1)
        groups.append((full, _min_p(probs, [min_p[i] for i in full]), None))
    while pending:
        width = min(pending)
        rows = pending.pop(width)
        values, ids, complete = top_window(select_rows(logits, rows), [ks[i] for i in rows],
                                           [top_p[i] for i in rows], width)
        done = complete.tolist()
        if not all(done):
            wider = pending.setdefault(min(width * 8, vocab), [])
            wider[:] = sorted(wider + [r for r, ok in zip(rows, done, strict=True) if not ok])
            keep = [j for j, ok in enumerate(done) if ok]
            rows, values, ids = [rows[j] for j in keep], values[keep], ids[keep]
        if rows:
            probs = _min_p(torch.softmax(values, dim=-1), [min_p[i] for i in rows])
            groups.append((rows, probs, ids))
    return groups


def _min_p(probs: torch.Tensor, min_p: Sequence[float]) -> torch.Tensor:
    """Zero, in place, probabilities below ``min_p * max prob`` of their row (0 disables it).
    The most likely token always stays. Not renormalised."""
    if any(m > 0.0 for m in min_p):
        scale = torch.tensor(min_p, dtype=probs.dtype, device=probs.device)[:, None]
        probs.masked_fill_(probs < probs.amax(dim=-1, keepdim=True) * scale, 0.0)
    return probs


def draw_from_cdf(probs: torch.Tensor, uniforms: torch.Tensor,
                  block: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF sampling: one column per row of unnormalised ``probs`` ``[n, w]`` from one
    uniform in [0, 1) per row (``uniforms`` ``[n]`` float64).

    Wide rows go in two levels (pick a block of ``block`` columns by its mass, then a column
    inside it), which reads the row once instead of writing a float64 cumulative sum of it.
    Cumulative sums are float64, so a column's chance equals its float32 probability to about
    1e-7 relative. Returns ``(columns, alive)``: ``alive`` is False for rows whose total mass is
    not a positive finite number (every token filtered out, or NaN from +inf logits); their
    column is meaningless. An alive row never returns a zero-probability column.
    """
    n, width = probs.shape
    rows = torch.arange(n, device=probs.device)
    if width <= 4 * block:
        columns, alive, _ = _search(probs.double().cumsum(dim=-1), uniforms[:, None])
        return columns, alive
    pad = -width % block
    blocks = (torch.nn.functional.pad(probs, (0, pad)) if pad else probs).view(n, -1, block)
    cdf = blocks.sum(dim=-1).double().cumsum(dim=-1)
    chosen, alive, target = _search(cdf, uniforms[:, None])
    before = torch.where(chosen > 0, cdf[rows, (chosen - 1).clamp(min=0)], 0.0)
    inner = blocks[rows, chosen].double().cumsum(dim=-1)
    columns, _, _ = _search(inner, target - before[:, None], scale=False)
    return (chosen * block + columns).clamp_(max=width - 1), alive


def _search(cdf: torch.Tensor, u: torch.Tensor, scale: bool = True,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """First index whose ``cdf`` exceeds ``u * total`` (or ``u`` itself when not ``scale``),
    kept below the total so that the index holds positive mass. Returns (index, alive,
    target)."""
    total = cdf[:, -1:]
    alive = (total[:, 0] > 0) & torch.isfinite(total[:, 0])
    below_total = torch.nextafter(total, torch.zeros_like(total))
    target = torch.minimum(u * total if scale else u, below_total)
    index = torch.searchsorted(cdf, target, right=True)[:, 0]
    return index.clamp_(max=cdf.shape[-1] - 1), alive, target


def fallback_argmax(raw_row: torch.Tensor, banned: Iterable[int]) -> int:
    """Argmax of a raw logits row with NaN as -inf, over the ids not in ``banned`` while any of
    them is above -inf, else over all ids (so token 0 when nothing is above -inf)."""
    row = raw_row.nan_to_num(nan=NEG_INF)
    ids = [t for t in banned if 0 <= t < row.numel()]
    if ids:
        allowed = row.index_fill(0, torch.tensor(ids, device=row.device), NEG_INF)
        if bool(allowed.max() > NEG_INF):
            row = allowed
    return int(row.argmax())


def add_logit_bias(logits: torch.Tensor, biases: Sequence[Sequence[tuple[int, float]]]) -> None:
    """OpenAI ``logit_bias``: add each row's ``(token id, bias)`` pairs, in place (ids outside
    the vocabulary are ignored)."""
    vocab = logits.shape[-1]
    triples = [(i, t, b) for i, pairs in enumerate(biases) for t, b in pairs if 0 <= t < vocab]
    if triples:
        rows, ids, values = zip(*triples, strict=True)
        index = (torch.tensor(rows, device=logits.device), torch.tensor(ids, device=logits.device))
        logits.index_put_(index, torch.tensor(values, dtype=logits.dtype, device=logits.device),
                          accumulate=True)


def allow_only(logits: torch.Tensor, allowed: Sequence[Sequence[int] | None]) -> None:
    """vLLM ``allowed_token_ids``: in each row with a list, every other id becomes -inf, in
    place (rows with ``None`` are untouched)."""
    vocab = logits.shape[-1]
    for i, ids in enumerate(allowed):
        if ids is None:
            continue
        keep = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
        valid = [t for t in ids if 0 <= t < vocab]
        if valid:
            keep[torch.tensor(valid, device=logits.device)] = True
        logits[i].masked_fill_(~keep, NEG_INF)


def apply_bitmasks(logits: torch.Tensor, rows: Sequence[int], constraints: Sequence[Any]) -> None:
    """Structured outputs: ``-inf`` for every token the row's constraint does not allow, in
    place. One int32 bitmask ``[len(rows), ceil(vocab / 32)]`` filled by the constraints
    (see :class:`hermes_async.step.TokenConstraint`), unpacked once (numpy, little-endian
    bits); ids past the constraint's vocabulary are not allowed."""
    if not rows:
        return
    n, vocab = logits.shape
    words = -(-max(vocab, *(c.vocab_size for c in constraints)) // 32)
    bitmask = np.zeros((len(rows), words), dtype=np.int32)
    for j, c in enumerate(constraints):
        c.fill_bitmask(bitmask[j, :-(-c.vocab_size // 32)])
        if c.vocab_size % 32:  # bits past the constraint's vocabulary stay banned
            bitmask[j, c.vocab_size // 32] &= (1 << (c.vocab_size % 32)) - 1
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    banned = torch.from_numpy(bits).to(logits.device) == 0
    if len(rows) == n:
        logits.masked_fill_(banned, NEG_INF)
        return
    index = torch.tensor(list(rows), dtype=torch.long, device=logits.device)
    logits[index] = logits[index].masked_fill_(banned, NEG_INF)
