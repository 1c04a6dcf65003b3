"""Speculative decoding on and off, one run: output tok/s where the answer copies its prompt and
where it does not, at concurrency 1, 8 and 32, with the acceptance figures beside each.

    .venv/bin/python loadtest/bench_speculative.py --out-dir /tmp/spec \\
        --update-benchmarks BENCHMARKS.md

Servers (arms): ``hermes-async serve`` (the embedded model unless ``--model``) without
speculation, with ``--speculative ngram`` and with ``--speculative suffix`` (``--methods``;
``--spec-arg key=value`` sets more ``[speculative]`` keys for both), and with ``--vllm`` vLLM
without and with its ngram proposer. All arms are started first, each on its own port, and
measured in turns: every cell (workload, concurrency) runs one round on each arm before the
next round, the arms' order rotating from round to round, so a drift of the machine's speed
(large on a shared VM) falls on every arm alike. A cell's figure is the median of its rounds'
tok/s; acceptance counts all its rounds. Idle arms wait on their sockets (no CPU).
Workloads (chat completions, greedy): ``repeat`` (repeat a paragraph word for word),
``json_edit`` (re-emit a JSON document with one field changed), ``rename`` (rename a variable
in a function), ``tool_result`` (answer by quoting a long tool result) and ``open`` (short
open questions: nothing to copy), and ``agent``, the README's agent loop (a forced
``get_weather`` call, its tool result, the answer; both turns' tokens count), where earlier
loops' answers are what the suffix tree can draft from. A cell sends ``max(4, concurrency)``
requests, ``concurrency`` at a time. Per workload and concurrency: completion tokens over the
wall time of the round, and from ``/metrics`` the drafted and accepted tokens of that round:
acceptance rate (accepted / drafted) and mean accepted length (accepted tokens per draft,
the bonus token not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_models import cpu_line, port_free, update_benchmarks
from compare_peers import REPO, Started, stop, wait_ready

MARK_START, MARK_END = "<!-- speculative:start -->", "<!-- speculative:end -->"
WORKLOADS = ("repeat", "json_edit", "rename", "tool_result", "open", "agent")
COPYING = WORKLOADS[:4]
SENTENCES = (
    "The harbor was quiet before the storm reached the island.",
    "Every morning the keeper climbed the stairs to clean the great lamp.",
    "Ships that passed at night saw the light turn slowly across the water.",
    "The old rope had been mended so many times that no one knew its first color.",
    "When the wind changed, the fishermen pulled their boats high onto the sand.",
    "A letter arrived in spring asking whether the lighthouse could be sold.",
    "The keeper wrote back that the light still guided three ferries a day.",
    "By summer the town had raised enough money to repair the tower.",
)
QUESTIONS = ("Give me three tips for sleeping better.", "Why is the sky blue?",
             "What should I pack for a weekend hike?", "How do plants make food?",
             "Suggest a name for a small bakery.", "What is a good way to learn to cook?",
             "Why do cats purr?", "How can I save money on groceries?")


def messages(workload: str, i: int) -> list[dict[str, str]]:
    """The ``i``-th request of ``workload`` (each request differs, so no answer is cached)."""
    rng = random.Random(f"{workload}-{i}")
    if workload == "repeat":
        text = " ".join(rng.sample(SENTENCES, 6))
        return [{"role": "user", "content": f"Repeat the following text exactly, word for "
                                            f"word:\n\n{text}"}]
    if workload == "json_edit":
        doc = {"id": 1000 + i, "name": rng.choice(["Ada", "Linus", "Grace", "Alan"]),
               "email": f"user{i}@example.com", "status": "open", "priority": rng.randint(1, 5),
               "tags": rng.sample(["billing", "bug", "ui", "api", "docs", "urgent"], 3),
               "created": f"2026-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
               "owner": {"team": "support", "name": rng.choice(["Kim", "Lee", "Sam"])}}
        return [{"role": "user", "content": "Here is a JSON document:\n"
                 f"{json.dumps(doc, indent=2)}\n\nReturn the same JSON document with "
                 "\"status\" changed to \"closed\". Output only the JSON."}]
    if workload == "rename":
        n = rng.randint(2, 9)
        code = (f"def summarize(values):\n    total = 0\n    count = 0\n    for v in values:\n"
                f"        if v > {n}:\n            total += v\n            count += 1\n"
                f"    if count == 0:\n        return 0\n    average = total / count\n"
                f"    print('total', total, 'count', count)\n    return average\n")
        return [{"role": "user", "content": "Rename the variable `total` to `running_sum` in "
                 f"this function and output the whole function:\n\n```python\n{code}```"}]
    if workload == "tool_result":
        rows = [f"- order {1000 + 7 * j + i}: {rng.choice(['shipped', 'packed', 'delayed'])}, "
                f"{rng.randint(1, 9)} items, to {rng.choice(['Oslo', 'Lima', 'Pune', 'Kyiv'])}"
                for j in range(12)]
        return [{"role": "user", "content": "Find the orders."},
                {"role": "assistant", "content": "I looked them up."},
                {"role": "user", "content": "Tool result:\n" + "\n".join(rows) +
                 "\n\nList every order above exactly as written."}]
    return [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]


def spec_counters(base: str) -> tuple[float, float, float]:
    """(drafts, drafted tokens, accepted tokens) from ``/metrics`` (hermes' or vLLM's names,
    summed over their labels)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()

    def total(name: str) -> float:
        return sum(float(v) for prefix in ("hermes_", "vllm:") for v in
                   re.findall(rf"^{prefix}{name}_total(?:{{[^}}]*}})? (\S+)$", text, re.M))

    return (total("spec_decode_num_drafts"), total("spec_decode_num_draft_tokens"),
            total("spec_decode_num_accepted_tokens"))


CITIES = ("Paris", "Oslo", "Lima", "Pune", "Kyiv", "Rome", "Cairo", "Quito", "Seoul", "Accra")
WEATHER_TOOL = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}]


async def chat(session: Any, base: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(f"{base}/v1/chat/completions", json=body) as r:
        data = await r.json()
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {data}")
    return data


async def agent_loop(session: Any, base: str, model: str, i: int, max_tokens: int) -> int:
    """The README's agent loop: a forced tool call, its result, the answer (greedy)."""
    rng = random.Random(f"agent-{i}")
    city = CITIES[i % len(CITIES)]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": f"What is the weather in {city}?"}]
    first = await chat(session, base, {"model": model, "messages": msgs, "tools": WEATHER_TOOL,
                                       "tool_choice": "required", "temperature": 0.0,
                                       "max_tokens": max_tokens})
    message = first["choices"][0]["message"]
    call = message["tool_calls"][0]
    result = {"city": city, "temperature_c": rng.randint(-5, 35),
              "conditions": rng.choice(["sunny", "cloudy", "light rain", "windy"]),
              "humidity_percent": rng.randint(20, 95)}
    msgs += [{k: v for k, v in message.items() if v is not None},
             {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}]
    second = await chat(session, base, {"model": model, "messages": msgs, "tools": WEATHER_TOOL,
                                        "temperature": 0.0, "max_tokens": max_tokens})
    return int(first["usage"]["completion_tokens"]) + int(second["usage"]["completion_tokens"])


async def round_of(session: Any, base: str, model: str, workload: str, concurrency: int,
                   max_tokens: int, offset: int) -> dict[str, float]:
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int) -> int:
        async with slots:
            if workload == "agent":
                return await agent_loop(session, base, model, offset + i, max_tokens)
            body = {"model": model, "messages": messages(workload, offset + i),
                    "max_tokens": max_tokens, "temperature": 0.0}
            return int((await chat(session, base, body))["usage"]["completion_tokens"])

    before = spec_counters(base)
    t0 = time.perf_counter()
    tokens = await asyncio.gather(*(one(i) for i in range(max(4, concurrency))))
    seconds = time.perf_counter() - t0
    drafts, drafted, kept = (b - a for a, b in zip(before, spec_counters(base), strict=True))
    return {"tok_s": sum(tokens) / seconds, "tokens": sum(tokens), "seconds": seconds,
            "drafts": drafts, "drafted": drafted, "accepted": kept}


@dataclass
class Arm:
    """One server of the comparison: its label, command line, extra environment and port."""

    label: str
    cmd: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def started(arms: list[Arm], out_dir: Path, timeout_s: float) -> Iterator[dict[str, Started]]:
    """Start every arm at once, wait until each serves; yield those that came up (a failed
    arm is reported and left out: one server failing must not end the comparison); stop all."""
    procs: dict[str, subprocess.Popen] = {}
    with contextlib.ExitStack() as stack:
        for arm in arms:
            print(f"[{arm.label}] starting on :{arm.port}: {' '.join(arm.cmd)}", flush=True)
            log = stack.enter_context((out_dir / f"{arm.label}.log").open("w"))
            procs[arm.label] = subprocess.Popen(arm.cmd, env={**os.environ, **arm.env},
                                                stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)
            stack.callback(stop, procs[arm.label])
        up: dict[str, Started] = {}
        t0 = time.monotonic()
        for arm in arms:
            base = f"http://127.0.0.1:{arm.port}"
            try:
                model = wait_ready(base, procs[arm.label], timeout_s)
            except Exception as e:  # noqa: BLE001 - reported, the other arms run
                print(f"[{arm.label}] FAILED to start: {e!r} (log: {out_dir / arm.label}.log)",
                      flush=True)
                continue
            up[arm.label] = Started(base, model, procs[arm.label].pid, time.monotonic() - t0)
            print(f"[{arm.label}] ready after {up[arm.label].startup_s:.0f} s", flush=True)
        yield up


def cell_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    """One cell's figure from its rounds: the median tok/s, the counters summed."""
    return {"tok_s": statistics.median(r["tok_s"] for r in rounds),
            "rounds_tok_s": [r["tok_s"] for r in rounds],
            **{k: sum(r[k] for r in rounds)
               for k in ("tokens", "seconds", "drafts", "drafted", "accepted")}}


async def measure(servers: dict[str, Started], args: argparse.Namespace
                  ) -> dict[str, dict[str, Any]]:
    """Every cell on every server, a round at a time in rotating order; per server the cells'
    figures (``cell_of``)."""
    import aiohttp

    labels = list(servers)
    rounds: dict[str, dict[str, list[dict[str, float]]]] = {label: {} for label in labels}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:
        for label in labels:  # warm-up
            await round_of(s, servers[label].base, servers[label].model, "open", 1, 8, 10_000)
        turn = 0
        for workload in args.workloads:
            for c in args.concurrency:
                key = f"{workload}@{c}"
                for r in range(args.rounds):
                    order = labels[turn % len(labels):] + labels[:turn % len(labels)]
                    turn += 1
                    for label in order:
                        one = await round_of(s, servers[label].base, servers[label].model,
                                             workload, c, args.max_tokens, 100 * r)
                        rounds[label].setdefault(key, []).append(one)
                print(f"  {key}: " + ", ".join(
                    f"{label} {cell_of(rounds[label][key])['tok_s']:.1f}" for label in labels)
                    + " tok/s", flush=True)
    return {label: {key: cell_of(rs) for key, rs in cells.items()}
            for label, cells in rounds.items()}


def proposer_cost(context_tokens: int = 8192, steps: int = 2000) -> str:
    """Microseconds per step of each proposer on a long context (its first call also indexes
    the prompt: reported apart)."""
    import random as rnd

    from hermes_async.config import SpeculativeConfig
    from hermes_async.engine.ngram import NgramIndex
    from hermes_async.engine.suffix import AnswerTree

    rng = rnd.Random(0)
    tokens = [rng.randrange(32000) for _ in range(context_tokens)]
    spec = SpeculativeConfig()
    index = NgramIndex(spec.min_n, spec.max_n)
    t0 = time.perf_counter()
    index.propose(tokens, 4)
    first_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    for _ in range(steps):
        tokens.append(rng.randrange(32000))
        index.propose(tokens, 4)
    ngram_us = (time.perf_counter() - t0) / steps * 1e6
    tree = AnswerTree(16, 256, 0.1)
    for _ in range(64):
        tree.add([rng.randrange(2000) for _ in range(500)])
    t0 = time.perf_counter()
    tree.add([rng.randrange(2000) for _ in range(500)])
    add_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    for _ in range(steps):
        tokens.append(rng.randrange(2000))
        tree.propose(tokens, 4, 2)
    tree_us = (time.perf_counter() - t0) / steps * 1e6
    return (f"Proposer cost per step (one sequence, {context_tokens}-token context): ngram "
            f"{ngram_us:.1f} us (its first call indexes the prompt: {first_ms:.1f} ms); "
            f"suffix tree lookup {tree_us:.1f} us over {tree.num_answers} stored answers "
            f"({tree.num_nodes} nodes; adding a 500-token answer {add_ms:.1f} ms).")


def report(results: dict[str, dict[str, Any] | None], args: argparse.Namespace,
           baseline: str = "off") -> str:
    """One row per workload and concurrency: the baseline's tok/s, then per method its tok/s,
    ratio to the baseline, acceptance rate and mean accepted length (accepted tokens per
    draft)."""
    methods = [m for m in results if m != baseline]
    head = f"| workload | conc. | {baseline} tok/s | " + " | ".join(
        f"{m} tok/s | {m} ratio | {m} acceptance | {m} accepted per draft" for m in methods)
    lines = [head + " |", "|" + "---|" * (3 + 4 * len(methods))]
    off = results.get(baseline) or {}
    for workload in args.workloads:
        for c in args.concurrency:
            key = f"{workload}@{c}"
            a = off.get(key)
            row = f"| {workload} | {c} | " + (f"{a['tok_s']:.1f} |" if a else "failed |")
            for m in methods:
                b = (results.get(m) or {}).get(key)
                if a is None or b is None:
                    row += " failed | | | |"
                    continue
                rate = b["accepted"] / b["drafted"] if b["drafted"] else 0.0
                per = b["accepted"] / b["drafts"] if b["drafts"] else 0.0
                row += (f" {b['tok_s']:.1f} | {b['tok_s'] / a['tok_s']:.2f}x | {rate:.2f} | "
                        f"{per:.2f} |")
            lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="HF directory or GGUF (default: embedded)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--port", type=int, default=8321,
                    help="the first arm's port; the next arms take the ports after it")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=["ngram", "suffix"],
                    choices=["ngram", "suffix"])
    ap.add_argument("--vllm", action="store_true",
                    help="also vLLM (loadtest/peers/install.sh vllm) without and with its "
                         "ngram proposer, as the anchor")
    ap.add_argument("--no-hermes", action="store_true", help="only the vLLM servers")
    ap.add_argument("--spec-arg", action="append", default=[],
                    help="key=value of [speculative] for the speculating servers (repeatable)")
    ap.add_argument("--kv-gib", type=float, default=1.0,
                    help="each server's KV cache (all arms run at once)")
    ap.add_argument("--out-dir", type=Path, default=Path("loadtest/results/speculative"))
    ap.add_argument("--update-benchmarks", type=Path, default=None)
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    spec_keys = dict(a.split("=", 1) for a in args.spec_arg)
    arms: list[Arm] = []
    specs = [] if args.no_hermes else [("off", [])] + [(m, ["--speculative", m])
                                                       for m in args.methods]
    for label, extra in specs:
        port = args.port + len(arms)
        cmd = [str(REPO / ".venv" / "bin" / "hermes-async"), "serve", "--dtype", args.dtype,
               "--port", str(port), "--log-level", "warning", *extra]
        if args.model:
            cmd += ["--model", args.model]
        # every arm's KV pool of --kv-gib (the default, a share of free memory, is for one
        # server alone on the machine)
        config = args.out_dir / f"arm-{label}.toml"
        text = f"[cache]\nkv_cache_bytes = {int(args.kv_gib * 2**30)}\n"
        if label != "off" and spec_keys:
            keys = "\n".join(f"{k} = {v}" for k, v in spec_keys.items())
            text += f"[speculative]\nmethod = \"{label}\"\n{keys}\n"
        config.write_text(text)
        arms.append(Arm(label, cmd + ["--config", str(config)], port))
    if args.vllm:
        from compare_peers import model_paths, server_command

        from hermes_async.config import SpeculativeConfig

        hf, gguf = model_paths() if args.model is None else (Path(args.model), Path())
        # vLLM's proposer with hermes' own settings (its defaults, --spec-arg overrides)
        spec = json.dumps({
            "method": "ngram",
            "num_speculative_tokens": int(spec_keys.get("num_tokens",
                                                        SpeculativeConfig.num_tokens)),
            "prompt_lookup_min": int(spec_keys.get("min_n", SpeculativeConfig.min_n)),
            "prompt_lookup_max": int(spec_keys.get("max_n", SpeculativeConfig.max_n))})
        for label, extra in (("vllm-off", []), ("vllm-ngram", ["--speculative-config", spec])):
            port = args.port + len(arms)
            cmd, env = server_command("vllm", port, hf, gguf, 2, args.dtype)
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(args.kv_gib)))  # GiB
            arms.append(Arm(label, cmd + ["--enable-auto-tool-choice", "--tool-call-parser",
                                          "hermes", *extra], port, env))
    for arm in arms:
        if not port_free(arm.port):
            raise SystemExit(f"port {arm.port} is taken")
    with started(arms, args.out_dir, 900) as servers:
        cells = asyncio.run(measure(servers, args)) if servers else {}
    results: dict[str, dict[str, Any] | None] = {
        a.label: cells.get(a.label) for a in arms if not a.label.startswith("vllm")}
    vllm_results: dict[str, dict[str, Any] | None] = {
        a.label: cells.get(a.label) for a in arms if a.label.startswith("vllm")}
    for label, cell in {**results, **vllm_results}.items():
        (args.out_dir / f"{label}.json").write_text(json.dumps(cell, indent=1))
    text = "\n".join([
        f"CPU: {cpu_line()}; model: {args.model or 'embedded default'}; greedy, max_tokens "
        f"{args.max_tokens}; max(4, concurrency) requests per cell; median of {args.rounds} "
        "round(s) per cell, the arms interleaved round by round", ""]
        + ([report(results, args)] if results else [])
        + ["", proposer_cost()]
        + (["", "vLLM (anchor, same run):", "", report(vllm_results, args, "vllm-off")]
           if vllm_results else []))
    (args.out_dir / "report.md").write_text(text + "\n")
    print(text)
    if args.update_benchmarks:
        update_benchmarks(args.update_benchmarks, "bench_speculative.py", text, MARK_START,
                          MARK_END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
