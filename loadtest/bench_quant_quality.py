"""Quality of each weight quantization scheme against the unquantized model, measured.

The default model (or ``--model DIR``) reads a fixed text (this repository's own
``docs/architecture.md``, tokenized with the model's tokenizer: shipped with the repo, the same
tokens every run) as ``--windows`` windows of ``--window`` tokens decoded in lockstep through
the paged runner, once per scheme. For every position it compares the scheme's next-token
distribution with the unquantized one's: the perplexity of the text, the mean KL divergence
``KL(p_none || p_scheme)`` and the greedy top-1 agreement. bfloat16 activations (the CPU
default where the CPU has AVX512-BF16), ``auto`` attention backend: the kernels a server runs.

    python loadtest/bench_quant_quality.py                       # none vs int8, default model
    python loadtest/bench_quant_quality.py --schemes none int8 --json /tmp/quality.json
    python loadtest/bench_quant_quality.py --dtype float32 --schemes none int4 int4+a8

A scheme ``X+a8`` is ``X``'s weights with ``model.activations = "int8"`` (int8 / int4 weights
times activations quantized to int8 in blocks of 32, where the kernels run: float32 on AVX2).

A scheme whose top-1 agreement falls under ``AGREEMENT_FLOOR`` is not offered as a default
(README "Quantization").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from hermes_async.config import CacheConfig, ModelConfig
from hermes_async.model.default_model import resolve_model_path
from hermes_async.model.runner import ModelRunner
from hermes_async.model.tokenizer import load_tokenizer
from hermes_async.step import SequenceStep

AGREEMENT_FLOOR = 0.90  # greedy top-1 agreement with the unquantized model
TEXT = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def windows_of(ids: list[int], count: int, length: int) -> list[list[int]]:
    """``count`` consecutive windows of ``length + 1`` tokens (inputs and the next token)."""
    need = count * length + 1
    if len(ids) < need:
        raise SystemExit(f"the text has {len(ids)} tokens, {need} needed")
    return [ids[i * length: (i + 1) * length + 1] for i in range(count)]


def log_probs(runner: ModelRunner, windows: list[list[int]]) -> torch.Tensor:
    """``[windows, length, vocab]`` float32 log-probabilities of each next token, the windows
    decoded together one token per step (a batch of decodes, as a server runs them)."""
    length = len(windows[0]) - 1
    per_block = runner.block_size
    blocks = -(-length // per_block)
    tables = [tuple(range(i * blocks, (i + 1) * blocks)) for i in range(len(windows))]
    out = []
    for pos in range(length):
        steps = [SequenceStep(t, pos, (w[pos],)) for t, w in zip(tables, windows, strict=True)]
        out.append(torch.log_softmax(runner.forward(steps).float(), dim=-1))
    return torch.stack(out, dim=1)


def compare(ref: torch.Tensor, ours: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Perplexity of the text under ``ours``, mean KL(ref || ours), top-1 agreement."""
    nll = -ours.gather(-1, targets[..., None]).squeeze(-1)
    kl = (ref.exp() * (ref - ours)).sum(-1)
    agree = (ref.argmax(-1) == ours.argmax(-1)).float()
    return {"perplexity": math.exp(float(nll.mean())), "kl_mean": float(kl.mean()),
            "kl_p99": float(kl.flatten().quantile(0.99)), "top1_agreement": float(agree.mean())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="HF directory or GGUF (default: embedded)")
    ap.add_argument("--schemes", nargs="+", default=["none", "int8"])
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    model_dir = resolve_model_path(args.model)
    ids = load_tokenizer(model_dir)(TEXT.read_text(), add_special_tokens=False)["input_ids"]
    windows = windows_of(list(ids), args.windows, args.window)
    targets = torch.tensor([w[1:] for w in windows])
    results: dict[str, dict[str, float]] = {}
    ref = None
    for scheme in args.schemes:
        quantization, a8, _ = scheme.partition("+a8")  # X+a8: int8 activations
        config = ModelConfig(dtype=args.dtype, quantization=quantization,
                             activations="int8" if a8 else "float")
        runner = ModelRunner(model_dir, config, CacheConfig(kv_cache_bytes=256 << 20))
        lp = log_probs(runner, windows)
        del runner
        if ref is None:
            ref = lp
        results[scheme] = compare(ref, lp, targets)
        print(f"{scheme}: {json.dumps(results[scheme])}", flush=True)
    lines = [f"text: {TEXT.name}, {args.windows} windows x {args.window} tokens; model "
             f"{model_dir.name}, {args.dtype} activations; reference: {args.schemes[0]}", "",
             "| scheme | perplexity | KL mean | KL p99 | top-1 agreement | default? |",
             "|---|---|---|---|---|---|"]
    for scheme, r in results.items():
        ok = "yes" if r["top1_agreement"] >= AGREEMENT_FLOOR else "no (under the floor)"
        lines.append(f"| {scheme} | {r['perplexity']:.3f} | {r['kl_mean']:.5f} | "
                     f"{r['kl_p99']:.5f} | {r['top1_agreement']:.4f} | {ok} |")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
