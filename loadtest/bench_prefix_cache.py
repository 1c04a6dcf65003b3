"""Micro-benchmark of the prefix cache bookkeeping (hermes_async/cache); prints markdown.

Shows that match and insert cost grow with the blocks walked (not the tree's size) and that one
eviction costs O(log n) in the cached blocks. Pure Python, one thread; the garbage collector is
paused inside timed sections. Usage::

    python loadtest/bench_prefix_cache.py [--block-size 16] [--prompts 1024,8192,32768]
                                          [--cached 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable

from timing import median_seconds

from hermes_async.cache import PrefixTree

VOCAB = 50_000
MATCH_TARGET_US = 1000.0  # 8k-token prompt
EVICT_TARGET_US = 20.0  # one eviction at 100k cached blocks



def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs, GC paused."""
    return median_seconds(fn, repeats, pause_gc=True)


def filled_tree(bs: int, num_blocks: int, rng: random.Random, chain: int = 64) -> PrefixTree:
    """``num_blocks`` unpinned cached blocks: chains of ``chain`` blocks (1k-token prompts at
    bs 16) under distinct first blocks, inserted one after the other (distinct LRU times)."""
    tree = PrefixTree(bs)
    next_block = 1_000_000  # never collides with the blocks a benchmark inserts itself
    while tree.num_nodes < num_blocks:
        n = min(chain, num_blocks - tree.num_nodes)
        tokens = [rng.randrange(VOCAB) for _ in range(n * bs)]
        tree.insert("bench", tokens, range(next_block, next_block + n))
        next_block += n
    return tree


def bench_prompt(bs: int, length: int, big: PrefixTree, rng: random.Random,
                 repeats: int) -> dict[str, float]:
    prompt = [rng.randrange(VOCAB) for _ in range(length)]
    n_blocks = length // bs
    cached = prompt[:n_blocks * bs]
    blocks = list(range(n_blocks))

    def insert_fresh() -> None:
        PrefixTree(bs).insert("bench", cached, blocks)

    t_insert = timed(insert_fresh, max(5, repeats // 10))
    full = PrefixTree(bs)
    full.insert("bench", cached, blocks)
    half = PrefixTree(bs)
    half.insert("bench", cached[:n_blocks // 2 * bs], blocks[:n_blocks // 2])
    miss = [prompt[0] + 1, *prompt[1:]]
    res = full.match("bench", prompt)
    start = max(big.block_ids(), default=0) + 1  # the same prompt among 100k other blocks
    big.insert("bench", cached, range(start, start + n_blocks))
    out = {
        "blocks": n_blocks,
        "matched": res.matched_len // bs,
        "insert": t_insert,
        "full": timed(lambda: full.match("bench", prompt), repeats),
        "probe": timed(lambda: full.match("bench", prompt, touch=False), repeats),
        "half": timed(lambda: half.match("bench", prompt), repeats),
        "miss": timed(lambda: full.match("bench", miss), repeats),
        "big": timed(lambda: big.match("bench", prompt), repeats),
    }
    return out


def bench_evict(bs: int, num_blocks: int, evictions: int, rng: random.Random) -> dict[str, float]:
    """Per-block eviction cost with ``num_blocks`` cached: one ``evict(1)`` call at a time, and
    one batched ``evict(n)`` call."""
    tree = filled_tree(bs, num_blocks + 2 * evictions, rng)
    singles = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(evictions):
            t0 = time.perf_counter()
            tree.evict(1)
            singles.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        tree.evict(evictions)
        batch = (time.perf_counter() - t0) / evictions
    finally:
        gc.enable()
    return {"single": statistics.median(singles), "p99": sorted(singles)[int(0.99 * evictions)],
            "batch": batch}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--prompts", default="1024,8192,32768", help="prompt lengths in tokens")
    ap.add_argument("--cached", default="1000,10000,100000", help="cached blocks for eviction")
    ap.add_argument("--big-tree", type=int, default=100_000,
                    help="blocks of the large tree that the prompts are also matched in")
    ap.add_argument("--evictions", type=int, default=2000, help="evictions timed per size")
    ap.add_argument("--repeats", type=int, default=200, help="runs per match timing")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    bs, rng = args.block_size, random.Random(args.seed)
    us = 1e6

    print(f"Python {platform.python_version()} on {platform.machine()}, block size {bs}, "
          f"median of {args.repeats} runs, GC paused while timing.\n")
    big = filled_tree(bs, args.big_tree, rng)
    print("| prompt tokens | blocks | insert, fresh tree (us) | insert per block (us) "
          "| match full hit (us) | matched blocks | per matched block (us) "
          "| probe, no touch (us) | match half hit (us) | match miss (us) "
          f"| full hit in {args.big_tree // 1000}k-block tree (us) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    results = {}
    for length in (int(x) for x in args.prompts.split(",")):
        r = results[length] = bench_prompt(bs, length, big, rng, args.repeats)
        print(f"| {length} | {r['blocks']} | {r['insert'] * us:.0f} "
              f"| {r['insert'] * us / r['blocks']:.2f} | {r['full'] * us:.1f} | {r['matched']} "
              f"| {r['full'] * us / r['matched']:.3f} | {r['probe'] * us:.1f} "
              f"| {r['half'] * us:.1f} | {r['miss'] * us:.2f} | {r['big'] * us:.1f} |")

    print("\n| cached blocks | evict(1) per call, median (us) | p99 (us) "
          "| evict(n) per block (us) |")
    print("|---:|---:|---:|---:|")
    evicts = {}
    for n in (int(x) for x in args.cached.split(",")):
        e = evicts[n] = bench_evict(bs, n, args.evictions, rng)
        print(f"| {n} | {e['single'] * us:.2f} | {e['p99'] * us:.2f} | {e['batch'] * us:.2f} |")

    print()
    if 8192 in results:
        t = results[8192]["full"] * us
        print(f"- target: match of an 8k-token prompt < {MATCH_TARGET_US:.0f} us: {t:.0f} us, "
              f"{'met' if t < MATCH_TARGET_US else 'MISSED'}")
    if 100_000 in evicts:
        t = evicts[100_000]["single"] * us
        print(f"- target: one eviction at 100k cached blocks < {EVICT_TARGET_US:.0f} us: "
              f"{t:.2f} us, {'met' if t < EVICT_TARGET_US else 'MISSED'}")
    print(f"- command: `{' '.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}`")


if __name__ == "__main__":
    main()
