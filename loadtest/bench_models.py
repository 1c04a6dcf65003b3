"""Real model shapes side by side: hermes_async, vLLM's CPU build and llama.cpp on the same
random weights (Hugging Face directory for hermes and vLLM, the same tensors as a GGUF for
llama.cpp and for hermes' GGUF path), one server at a time, in one run.

    loadtest/peers/install.sh vllm llamacpp          # once
    .venv/bin/python loadtest/bench_models.py --out-dir loadtest/results/models \\
        --models qwen3-0.6b qwen3-1.7b qwen3-30b-a3b:4 --update-benchmarks BENCHMARKS.md

Per model and server: load time (spawn to the first ``/v1/models`` answer), resident memory
after a warm-up (the server's process tree), decode tok/s of one stream (concurrency 1: the
generated tokens over the time after the first token) and of 8 concurrent streams (all tokens
over the wall time), and prefill tok/s (a 1000-token prompt, one token out, distinct prompts so
no prefix cache helps). Beside them the memory floor of a decode step: the bytes of the
weights one token reads (every matrix once; of the embedding table one row; of a MoE layer the
experts a token routes to) over the copy bandwidth measured here, as tokens/s.

Random weights (std 0.02, loadtest/shaped_models.py) in bfloat16; the GGUF in BF16 (the same
precision) and, with ``--q8``, Q8_0 for llama.cpp (its quantized speed; hermes has no
quantized kernels yet). The tokenizer is the embedded model's (its vocabulary padded to the
model's): speed figures, not quality.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compare_peers import PEERS_HOME, REPO, Started, serve_and_measure

SERVERS = ("hermes", "hermes-gguf", "vllm", "llamacpp")
MARK_START, MARK_END = "<!-- models:start -->", "<!-- models:end -->"
WORDS = ("sea", "ship", "harbor", "wind", "sail", "tide", "storm", "island", "light", "rope",
         "anchor", "wave", "north", "south", "map", "star", "night", "cargo", "crew", "deck")


@dataclass(frozen=True)
class ModelCase:
    """One shaped model: its name in shaped_models.SHAPES and the layers kept (None: all)."""

    name: str
    layers: int | None

    @property
    def label(self) -> str:
        return self.name + (f" ({self.layers} layers)" if self.layers else "")

    @property
    def slug(self) -> str:
        return self.name + (f"-l{self.layers}" if self.layers else "")


def parse_case(text: str) -> ModelCase:
    name, _, layers = text.partition(":")
    return ModelCase(name, int(layers) if layers else None)


def prepare(case: ModelCase, work: Path, q8: bool,
            qtypes: tuple[str, ...] | None = None) -> dict[str, Path]:
    """The HF directory (bfloat16) and its GGUFs; the tokenizer is the embedded model's,
    padded in the GGUF to the model's vocabulary (``[PAD<i>]`` entries, as llama.cpp needs
    them), and that padded tokenizer (as hermes rebuilds it from the GGUF) goes into the HF
    directory too, so that no server meets an id its tokenizer lacks. ``qtypes``: the GGUFs
    to write (default BF16, and Q8_0 with ``q8``)."""
    from shaped_models import make

    from hermes_async.model.default_model import fetch_default_model
    from hermes_async.model.gguf.directory import prepare_gguf_dir
    from hermes_async.model.gguf.writer import write_gguf

    tokenizer_dir = fetch_default_model(progress=False)
    hf = work / case.slug
    if not (hf / "config.json").is_file():
        print(f"[prepare] {case.label}: random weights -> {hf}", flush=True)
        make(case.name, hf, case.layers)
    out = {"hf": hf}
    if qtypes is None:
        qtypes = ("BF16", "Q8_0") if q8 else ("BF16",)
    for qtype in dict.fromkeys(("BF16", *qtypes)):
        path = work / f"{case.slug}.{qtype}.gguf"
        if not path.is_file():
            print(f"[prepare] {case.label}: {qtype} GGUF -> {path}", flush=True)
            part = path.with_suffix(".part")
            write_gguf(hf, part, qtype, tokenizer_dir=tokenizer_dir)
            part.rename(path)
        out[qtype] = path
    if not (hf / "tokenizer.json").is_file():
        padded = prepare_gguf_dir(out["BF16"], work / "home")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(padded / name, hf / name)
    return out


def server_command(server: str, port: int, files: dict[str, Path], threads: int,
                   qtype: str, dtype: str = "bfloat16") -> tuple[list[str], dict[str, str]]:
    """``dtype``: hermes' (bfloat16, or float32 on CPUs without native bf16)."""
    if server in ("hermes", "hermes-gguf"):  # hermes-gguf: the GGUF of qtype (BF16, Q8_0...)
        model = files["hf"] if server == "hermes" else files[qtype]
        return ([str(REPO / ".venv" / "bin" / "hermes-async"), "serve", "--dtype", dtype,
                 "--port", str(port), "--log-level", "warning", "--model", str(model)], {})
    if server == "vllm":
        return ([str(PEERS_HOME / "vllm" / "bin" / "python"), "-m",
                 "vllm.entrypoints.openai.api_server", "--model", str(files["hf"]),
                 "--dtype", "bfloat16", "--port", str(port), "--max-model-len", "4096",
                 "--served-model-name", "model"],
                {"VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_CPU_KVCACHE_SPACE": "2"})
    if server == "llamacpp":
        return ([str(PEERS_HOME / "llamacpp" / "bin" / "python"), "-m", "llama_cpp.server",
                 "--model", str(files[qtype]), "--model_alias", "model", "--port", str(port),
                 "--n_ctx", "4096", "--n_threads", str(threads), "--n_batch", "512",
                 "--interrupt_requests", "False"], {})
    raise ValueError(server)


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (/proc)."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f
                              if line.startswith("VmRSS:"))
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, StopIteration, ValueError):
            continue
    return total


def text_prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def complete(session: Any, base: str, prompt: str, max_tokens: int,
                   model: str) -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}
    t0 = time.perf_counter()
    async with session.post(f"{base}/v1/completions", json=body) as r:
        data = await r.json()
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {data}")
    return {"s": time.perf_counter() - t0, "prompt": data["usage"]["prompt_tokens"],
            "completion": data["usage"]["completion_tokens"]}


async def measure(base: str, model: str, seed: int, decode_tokens: int) -> dict[str, float]:
    import aiohttp

    rng = random.Random(seed)

    def complete_(session: Any, prompt: str, max_tokens: int) -> Any:
        return complete(session, base, prompt, max_tokens, model)

    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        await complete_(s, text_prompt(rng, 40), 8)  # warm-up
        prefill = [await complete_(s, f"{i} " + text_prompt(rng, 1000), 1)
                   for i in range(2)]
        ttft = min(r["s"] for r in [await complete_(s, f"t{i} " + text_prompt(rng, 32), 1)
                                    for i in range(3)])
        c1 = [await complete_(s, f"c{i} " + text_prompt(rng, 32), decode_tokens)
              for i in range(3)]
        rounds = []
        for r in range(2):
            t0 = time.perf_counter()
            c8 = await asyncio.gather(*(complete_(s, f"p{r}-{i} " + text_prompt(rng, 32),
                                                 decode_tokens) for i in range(8)))
            rounds.append(sum(x["completion"] for x in c8) / (time.perf_counter() - t0))
    return {
        "prefill_tok_s": max(r["prompt"] / r["s"] for r in prefill),
        "ttft_short_s": ttft,
        "decode_c1_tok_s": max((r["completion"] - 1) / (r["s"] - ttft) for r in c1),
        "decode_c8_tok_s": max(rounds),
        "decode_c8_rounds": rounds,
    }


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def run_server(server: str, case: ModelCase, files: dict[str, Path], args: argparse.Namespace,
               qtype: str = "BF16") -> dict[str, Any] | None:
    if not port_free(args.port):  # a server left over would answer (and share the cores)
        raise SystemExit(f"port {args.port} is in use: stop what listens there first")
    cmd, env = server_command(server, args.port, files, args.threads, qtype)

    def measure_one(started: Started) -> dict[str, Any]:
        res = asyncio.run(measure(started.base, started.model, seed=7,
                                  decode_tokens=args.decode_tokens))
        res.update(load_s=started.startup_s, rss_bytes=rss_bytes(started.pid))
        print(f"[{case.label}] {server} {qtype}: {json.dumps(res)}", flush=True)
        return res

    return serve_and_measure(f"{case.label}] [{server} {qtype}", cmd, env, args.port,
                             args.out_dir / f"{case.slug}-{server}-{qtype}.log",
                             args.start_timeout, measure_one)


def read_bandwidth() -> float:
    """Bytes/s of reading a 2 GiB tensor once with torch's threads (a sum: every byte read,
    nothing written): what a decode step streaming its weights can reach; best of 5."""
    import torch

    src = torch.ones(1 << 29, dtype=torch.float32)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        src.sum()
        best = min(best, time.perf_counter() - t0)
    return src.numel() * 4 / best


def bytes_per_token(hf: Path) -> int:
    """Weight bytes one decode token reads (bfloat16): every matrix once, of the embedding
    table one row (all of it where it is also the LM head), of each MoE layer's experts the
    ``num_experts_per_tok`` of ``num_experts`` it routes to."""
    from safetensors import safe_open

    cfg = json.loads((hf / "config.json").read_text())
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 1
    routed = cfg.get("num_experts_per_tok", 0) / experts
    total = 0
    for f in sorted(hf.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            for name in h.keys():  # noqa: SIM118
                shape = h.get_slice(name).get_shape()
                n = 1
                for d in shape:
                    n *= d
                if name.endswith("embed_tokens.weight") and not cfg.get("tie_word_embeddings"):
                    n = shape[-1]
                elif ".experts." in name:
                    n = int(n * routed)
                total += 2 * n
    return total


RATES = ("prefill_tok_s", "decode_c1_tok_s", "decode_c8_tok_s")


def merge_starts(starts: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One server's results over several starts of it: the best rate of each measurement
    (the per-process bandwidth varies by up to 1.36x on these VMs; the best start is the one
    the memory system did not hold back), the quickest load, the largest RSS, and each rate's
    values per start (``<rate>_starts``)."""
    done = [r for r in starts if r is not None]
    if not done:
        return None
    merged = dict(done[0])
    for key in [k for k in done[0] if k in RATES or k.endswith("_tok_s")]:
        merged[key] = max(r[key] for r in done)
        merged[f"{key}_starts"] = [r[key] for r in done]
    merged["load_s"] = min(r["load_s"] for r in done)
    merged["rss_bytes"] = max(r["rss_bytes"] for r in done)
    merged["starts"] = len(done)
    return merged


def spread(res: dict[str, Any], key: str) -> str:
    """``best`` or ``best (lowest-highest)`` over the starts."""
    values = res.get(f"{key}_starts", [res[key]])
    if len(values) < 2:
        return f"{res[key]:.1f}"
    return f"{res[key]:.1f} ({min(values):.1f}-{max(values):.1f})"


def report(rows: list[dict[str, Any]], cpu: str, bandwidth: float) -> str:
    lines = [
        f"CPU: {cpu}; read bandwidth {bandwidth / 1e9:.1f} GB/s; bfloat16 weights (llama.cpp: "
        "BF16 GGUF of the same tensors; Q8_0 rows where run)", "",
        "| model | server | load s | RSS GiB | prefill tok/s | decode c1 tok/s | decode c8 tok/s "
        "| c1 vs floor | hermes c1 / it | hermes c8 / it |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        base = next((r for r in rows if r["model"] == row["model"] and r["server"] == "hermes"),
                    None)
        res = row["res"]
        if res is None:
            lines.append(f"| {row['model']} | {row['server']} | failed | | | | | | | |")
            continue
        ratio1 = ratio8 = ""
        if base and base["res"] and row["server"] != "hermes":
            ratio1 = f"{base['res']['decode_c1_tok_s'] / res['decode_c1_tok_s']:.2f}x"
            ratio8 = f"{base['res']['decode_c8_tok_s'] / res['decode_c8_tok_s']:.2f}x"
        lines.append(
            f"| {row['model']} | {row['server']} | {res['load_s']:.0f} | "
            f"{res['rss_bytes'] / 2**30:.1f} | {res['prefill_tok_s']:.0f} | "
            f"{spread(res, 'decode_c1_tok_s')} | {spread(res, 'decode_c8_tok_s')} | "
            f"{res['decode_c1_tok_s'] / row['floor_tok_s']:.2f} | {ratio1} | {ratio8} |")
    return "\n".join(lines)


def update_benchmarks(path: Path, script: str, text: str, start: str, end: str) -> None:
    """Put ``text`` (with the command that made it) between the ``start`` and ``end`` marks
    of ``path``, or at its end where the marks are not there yet."""
    doc = path.read_text()
    cmd = f"python loadtest/{script} " + " ".join(sys.argv[1:])
    block = f"{start}\n`{cmd}`\n\n{text}\n{end}"
    if start in doc:
        head, rest = doc.split(start, 1)
        doc = head + block + rest.split(end, 1)[1]
    else:
        doc += "\n" + block + "\n"
    path.write_text(doc)


def cpu_line() -> str:
    model, flags = "?", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    keep = [f for f in ("avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
            if f in flags]
    return f"{model}, {os.cpu_count()} cores, {' '.join(keep) or 'no AVX-512'}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["qwen3-0.6b", "qwen3-1.7b", "qwen3-30b-a3b:4"],
                    help="shaped_models names, NAME:LAYERS to keep the first layers")
    ap.add_argument("--servers", nargs="+", default=list(SERVERS), choices=SERVERS)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/hermes-bench-models"))
    ap.add_argument("--out-dir", type=Path, default=Path("loadtest/results/models"))
    ap.add_argument("--q8", action="store_true", help="also llama.cpp on a Q8_0 GGUF")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--port", type=int, default=8311)
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--starts", type=int, default=1,
                    help="starts of each server, interleaved (server A, B, ..., A, B, ...); "
                         "each rate is the best start's, the table shows the range")
    ap.add_argument("--update-benchmarks", type=Path, default=None)
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    bandwidth = read_bandwidth()
    rows: list[dict[str, Any]] = []
    for case in map(parse_case, args.models):
        files = prepare(case, args.work_dir, args.q8)
        floor = bandwidth / bytes_per_token(files["hf"])
        runs = [(server, "BF16") for server in args.servers]
        if args.q8 and "llamacpp" in args.servers:
            runs.append(("llamacpp", "Q8_0"))
        results: dict[tuple[str, str], list[dict[str, Any] | None]] = {r: [] for r in runs}
        for _ in range(args.starts):
            for server, qtype in runs:
                results[server, qtype].append(run_server(server, case, files, args, qtype))
        for (server, qtype), starts in results.items():
            label = server if qtype == "BF16" else f"{server} {qtype}"
            rows.append({"model": case.label, "server": label, "floor_tok_s": floor,
                         "res": merge_starts(starts)})
        (args.out_dir / "results.json").write_text(json.dumps(rows, indent=2))
    text = report(rows, cpu_line(), bandwidth)
    (args.out_dir / "report.md").write_text(text + "\n")
    print(text)
    if args.update_benchmarks:
        update_benchmarks(args.update_benchmarks, "bench_models.py", text, MARK_START, MARK_END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
