"""Sampler micro benchmark: cost of one ``Sampler.sample`` call per batch size and parameter mix.

Logits: by default real ones, the default model's (SmolLM2-135M-Instruct, vocab 49152) next-token
logits at each position of a fixed English paragraph (converted on first use); ``--synthetic``
uses ``randn * scale`` instead (a far flatter distribution: top-p nuclei of thousands of tokens).
Prints a markdown table of the median wall time per call and per row.

    python loadtest/bench_sampler.py                       # batches 1 8 32
    python loadtest/bench_sampler.py --synthetic --device cuda --repeat 50
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from timing import median_seconds

from hermes_async.model.logits_processors import draw_from_cdf
from hermes_async.model.sampler import Sampler, SamplingRequest
from hermes_async.types import SamplingParams

FULL = dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
            frequency_penalty=0.3, presence_penalty=0.2)
SCENARIOS: dict[str, tuple[dict, bool]] = {  # name -> (params, seeded per row)
    "greedy": (dict(temperature=0.0), False),
    "greedy + repetition penalty": (dict(temperature=0.0, repetition_penalty=1.1), False),
    "temperature 0.8": (dict(temperature=0.8), False),
    "temperature 0.8, seeded": (dict(temperature=0.8), True),
    "top_p 0.9 (no top_k), seeded": (dict(temperature=0.8, top_p=0.9), True),
    "full filters + penalties, seeded": (FULL, True),
    "full + top_logprobs 5, seeded": ({**FULL, "top_logprobs": 5}, True),
}


def median_us(fn: Callable[[], object], repeat: int) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else None
    return median_seconds(fn, repeat, warmup=1, sync=sync) * 1e6


TEXT = ("The history of the city begins in the early middle ages, when a small settlement grew "
        "around a river crossing. Merchants arrived from the south and the north, and over the "
        "following centuries the town became a centre of trade, learning and")


def real_logits() -> torch.Tensor:
    """``[positions, vocab]`` next-token logits of the default model over TEXT (float32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hermes_async.model.default_model import fetch_default_model

    path = fetch_default_model()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = AutoTokenizer.from_pretrained(path)(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits[0]


def bench(device: str, source: torch.Tensor | None, vocab: int, batches: list[int], repeat: int,
          scale: float, prompt_len: int, output_len: int) -> list[tuple[str, int, float]]:
    sampler = Sampler(device, seed=0)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(vocab, (prompt_len,), generator=gen).tolist()
    output = torch.randint(vocab, (output_len,), generator=gen).tolist()
    rows = []
    for name, (kw, seeded) in SCENARIOS.items():
        params = SamplingParams(**kw, seed=1 if seeded else None)
        for batch in batches:
            if source is None:
                logits = torch.randn(batch, vocab, generator=gen) * scale
            else:  # distinct positions of the paragraph
                logits = source[torch.arange(batch) % source.shape[0]]
            logits = logits.to(device)
            reqs = [SamplingRequest(params, prompt, output,
                                    sampler.new_generator(i) if seeded else None)
                    for i in range(batch)]
            rows.append((name, batch, median_us(
                lambda lg=logits, rq=reqs: sampler.sample(lg, rq), repeat)))
    return rows


def draw_costs(vocab: int, batch: int, repeat: int) -> dict[str, float]:
    """The draw alone over full-vocabulary rows: the sampler's inverse CDF (one uniform per
    row) vs the exponential race (one exponential per token)."""
    probs = torch.softmax(torch.randn(batch, vocab) * 2, dim=-1)
    uniforms = torch.rand(batch, dtype=torch.float64)

    def race() -> object:
        return (probs / torch.empty_like(probs).exponential_()).argmax(-1)

    return {"inverse CDF": median_us(lambda: draw_from_cdf(probs, uniforms), repeat),
            "exponential race": median_us(race, repeat)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--synthetic", action="store_true", help="random logits, no model")
    ap.add_argument("--vocab", type=int, default=49152, help="with --synthetic")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: steady figures on a shared machine)")
    ap.add_argument("--scale", type=float, default=2.0, help="std of the synthetic logits")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    source = None if args.synthetic else real_logits()
    vocab = args.vocab if source is None else source.shape[-1]
    kind = f"randn*{args.scale}" if source is None else "real (default model)"
    print(f"vocab {vocab}, device {args.device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, logits {kind}, history "
          f"{args.prompt_len} prompt + {args.output_len} output tokens, median of {args.repeat}")
    rows = bench(args.device, source, vocab, args.batches, args.repeat, args.scale,
                 args.prompt_len, args.output_len)
    header = " | ".join(f"batch {b}: call (us) | per row (us)" for b in args.batches)
    print(f"\n| scenario | {header} |\n|---|" + "---:|---:|" * len(args.batches))
    for name in SCENARIOS:
        cells = [(us, us / b) for n, b, us in rows if n == name]
        print(f"| {name} | " + " | ".join(f"{c:.0f} | {r:.0f}" for c, r in cells) + " |")
    if args.device == "cpu":
        batch = max(args.batches)
        costs = draw_costs(vocab, batch, args.repeat)
        print(f"\nDraw only, batch {batch}: " +
              ", ".join(f"{k} {v:.0f} us" for k, v in costs.items()))


if __name__ == "__main__":
    main()
