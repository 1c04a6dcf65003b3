"""Micro-benchmark of per-token output text work (hermes_async/engine); prints markdown.

Cost per generated token of :class:`IncrementalDetokenizer` (and of :class:`OutputText`, which
adds stop strings) on the default model's tokenizer, against the naive way: decoding the whole
output after every token. The token stream is 2000 tokens of mixed text (prose, code, markdown,
CJK and emoji, so multi-byte characters split across tokens) after a chat prompt. One thread,
garbage collector paused while timing; each figure is the median of ``--repeats`` runs over the
whole stream. Usage::

    python loadtest/bench_detokenizer.py [--tokens 2000] [--repeats 5] [--model DIR]
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

from timing import median_seconds

from hermes_async.engine.detokenizer import IncrementalDetokenizer
from hermes_async.engine.output_text import OutputText

PARAGRAPHS = [
    "Sure! Here is a short explanation of how a prefix cache works in an inference server. "
    "When many requests share the same system prompt, the key/value tensors computed for it can "
    "be reused, so only the new tokens of each request need a forward pass.",
    "```python\ndef fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n"
    "        a, b = b, a + b\n    return a\n```\n",
    "| language | greeting |\n|---|---|\n| Chinese | 你好，世界！ |\n| Japanese | こんにちは |\n"
    "| Korean | 안녕하세요 |\n| Russian | Привет, мир |\n",
    "Emoji check: 🎉 🚀 👍🏽 🧑‍💻 🇫🇷 — and some math: ∑ᵢ xᵢ² ≤ ∞, naïve café déjà vu.",
    "In summary, 1) reuse the cache, 2) batch decodes with prefills, 3) stream text as soon as "
    "it is final. Let me know if you want more details!",
]
STOPS = ["</answer>", "\n\nUser:"]



def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs, GC paused."""
    return median_seconds(fn, repeats, pause_gc=True)


def token_stream(tokenizer: Any, n: int) -> list[int]:
    ids: list[int] = []
    i = 0
    while len(ids) < n:
        ids += tokenizer.encode(PARAGRAPHS[i % len(PARAGRAPHS)] + "\n\n", add_special_tokens=False)
        i += 1
    return ids[:n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default=None, help="HF directory (default: the embedded model)")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from hermes_async.model.default_model import fetch_default_model

    model_dir = args.model or str(fetch_default_model())
    tok = AutoTokenizer.from_pretrained(model_dir)
    backend = tok.backend_tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "Explain prefix caching."}],
                                     add_generation_prompt=True, tokenize=True, return_dict=False)
    prompt = list(prompt)
    ids = token_stream(tok, args.tokens)
    n = len(ids)

    def incremental() -> str:
        d = IncrementalDetokenizer(tok, prompt)
        return "".join([d.add(t) for t in ids]) + d.flush()

    def output_text() -> str:
        out = OutputText(tok, prompt, STOPS)
        for t in ids:
            out.append(t)
        out.finish()
        return out.text

    def rust_stream() -> str:
        from tokenizers.decoders import DecodeStream

        stream = DecodeStream(skip_special_tokens=True)  # no prompt context, no flush
        return "".join([stream.step(backend, t) or "" for t in ids])

    def full_backend() -> None:
        for i in range(1, n + 1):
            backend.decode(ids[:i], skip_special_tokens=True)

    def full_transformers() -> None:
        for i in range(1, n + 1):
            tok.decode(ids[:i], skip_special_tokens=True)

    expected = tok.decode(ids, skip_special_tokens=True)
    assert incremental() == expected, "incremental text differs from the full decode"
    assert output_text() == expected, "no stop string occurs in the stream"

    def first_last(k: int) -> tuple[float, float]:
        """Per-token cost of the first and the last ``k`` tokens of the stream (us)."""
        d = IncrementalDetokenizer(tok, prompt)
        costs = []
        gc.disable()
        try:
            for t in ids:
                t0 = time.perf_counter_ns()
                d.add(t)
                costs.append(time.perf_counter_ns() - t0)
        finally:
            gc.enable()
        return statistics.median(costs[:k]) / 1e3, statistics.median(costs[-k:]) / 1e3

    rows = [
        ("IncrementalDetokenizer.add (hermes)", timed(incremental, args.repeats)),
        ("OutputText.append (detok + 2 stop strings)", timed(output_text, args.repeats)),
        ("tokenizers' own DecodeStream.step (Rust, reference)", timed(rust_stream, args.repeats)),
        ("full decode each step, tokenizers backend", timed(full_backend, args.repeats)),
        ("full decode each step, transformers decode",
         timed(full_transformers, max(1, args.repeats // 2))),
    ]
    early, late = first_last(200)
    last_full = min(timeit.repeat(lambda: backend.decode(ids, skip_special_tokens=True),
                                  number=20, repeat=args.repeats)) / 20

    print(f"Tokens: {n} (chat prompt of {len(prompt)} tokens as context). Python "
          f"{platform.python_version()}, {platform.machine()}, tokenizers "
          f"{sys.modules['tokenizers'].__version__}.\n")
    print("| method | total for the stream (ms) | per token (us) | vs incremental |")
    print("|---|---:|---:|---:|")
    base = rows[0][1]
    for name, sec in rows:
        print(f"| {name} | {sec * 1e3:.1f} | {sec / n * 1e6:.2f} | {sec / base:.1f}x |")
    print(f"\nIncremental per-token median: first 200 tokens {early:.2f} us, last 200 tokens "
          f"{late:.2f} us (flat). One full decode of all {n} tokens: {last_full * 1e6:.0f} us "
          f"(what the naive way pays at the last step).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
