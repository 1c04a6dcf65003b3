"""Do a client that stops reading its stream slow the others down? Inter-token latency of N
normal streams with and without one stuck reader, on the real default model.

Starts ``hermes-async serve`` (a subprocess, port 0, a small KV pool) with ``[server]
write_timeout_s`` long enough to outlast the measurement, then measures N concurrent streamed
chat completions (``ignore_eos``, ``--max-tokens`` each) three times:

1. ``baseline``: the N streams alone;
2. ``+1 reader``: with a fifth stream of the stuck reader's kind that is read normally (the
   same batch size as in 3: what one more sequence costs by itself);
3. ``+1 stuck``: with a raw-socket client (SO_RCVBUF 4 KiB) that sent the same request and
   never reads. Its chunks carry ``top_logprobs`` (~2 KiB each) so that it fills the buffers
   within seconds (its socket has an Ethernet-sized MSS: on loopback's 64 KiB one the kernel
   grows its send buffer to megabytes); the run starts once the server's kernel send queue
   to it (``/proc/net/tcp``) has stopped growing for 5 s, and 5 s more (aiohttp's buffer).

Afterwards the server's log must show the stuck stream aborted (``client stopped reading for
N s``). Its writes wait in total N s from the moment it last kept up, so the abort dates when
it fell behind: the script says whether that was before run 3 began (behind throughout).
Prints a markdown table (ITL p50/p99, TTFT p50, tokens/s of the N streams) and the CPU line.
One run of each; a figure, not a test.

    python loadtest/bench_stuck_client.py                  # N=4, 128 tokens each
    python loadtest/bench_stuck_client.py --streams 8 --max-tokens 256
    python loadtest/bench_stuck_client.py --num-threads 1   # steadier on a shared machine
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
from openai_stream import RequestRecord, stream_chat

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Write a long story about a lighthouse keeper and the sea."
LISTENING = re.compile(r"listening on (http://\S+)")


def cpu_line() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                  if ln.startswith("model name")), platform.processor())
    return f"CPU: {model}, {os.cpu_count()} logical cores"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class Server:
    """``hermes-async serve`` in a subprocess; its log lines kept with their arrival time."""

    def __init__(self, write_timeout_s: float, num_threads: int | None) -> None:
        self.config = Path(tempfile.mkdtemp(prefix="bench-stuck-")) / "server.toml"
        threads = f"[model]\nnum_threads = {num_threads}\n" if num_threads else ""
        self.config.write_text(
            f"{threads}[cache]\nkv_cache_bytes = 268435456\n"
            f"[server]\nport = 0\nwrite_timeout_s = {write_timeout_s}\n")
        self.write_timeout_s = write_timeout_s
        self.lines: list[tuple[float, str]] = []
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> Server:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hermes_async", "serve", "--config", str(self.config),
             "--log-level", "warning"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        t0 = time.monotonic()
        while not self.url:
            if self.proc.poll() is not None or time.monotonic() - t0 > 120:
                raise RuntimeError("the server did not start:\n" + self.log())
            time.sleep(0.05)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))
            if not self.url and (m := LISTENING.search(line)):
                self.url = m[1]

    def log(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first(self, needle: str) -> float | None:
        """When a log line containing ``needle`` arrived (monotonic), or None."""
        return next((t for t, line in self.lines if needle in line), None)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


async def wait_ready(session: aiohttp.ClientSession, url: str) -> str:
    """Wait for ``/health``; the served model's name."""
    for _ in range(1200):
        try:
            async with session.get(f"{url}/health") as r:
                if r.status == 200:
                    break
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    else:
        raise RuntimeError("the model did not load")
    async with session.get(f"{url}/v1/models") as r:
        return (await r.json())["data"][0]["id"]


def chat_body(model: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            **extra}


STUCK_EXTRA = {"logprobs": True, "top_logprobs": 20}  # ~2 KiB an event
# The N streams ask for their chosen token's logprob: a step mixing rows with and without
# logprobs fails in StepExecutor.execute (top_logprobs None for the rows that did not ask).
NORMAL_EXTRA = {"logprobs": True}


async def measure(session: aiohttp.ClientSession, url: str, model: str, streams: int,
                  max_tokens: int, fifth: bool) -> list[RequestRecord]:
    """N streams at once (and a read fifth one of the stuck kind when ``fifth``)."""
    target = f"{url}/v1/chat/completions"
    calls = [stream_chat(session, target, chat_body(model, max_tokens, **NORMAL_EXTRA), index=i)
             for i in range(streams)]
    if fifth:
        calls.append(stream_chat(session, target,
                                 chat_body(model, max_tokens * 2, **STUCK_EXTRA), index=-1))
    records = await asyncio.gather(*calls)
    for rec in records:
        if rec.error:
            raise RuntimeError(f"stream {rec.index} failed: {rec.error}")
    return [r for r in records if r.index >= 0]


def summary(label: str, records: list[RequestRecord]) -> dict[str, Any]:
    """ITL percentiles, median TTFT and output tokens/s of the N streams (from the first
    start to the last end among them)."""
    itls = [x for r in records for x in r.itls]
    tokens = sum(r.output_tokens or 0 for r in records)
    wall_s = (max(r.start + (r.e2e or 0.0) for r in records)
              - min(r.start for r in records))
    return {"label": label, "itl_p50": 1e3 * percentile(itls, 50),
            "itl_p99": 1e3 * percentile(itls, 99),
            "ttft_p50": 1e3 * statistics.median(r.ttft or 0.0 for r in records),
            "tok_s": tokens / wall_s, "itls": len(itls)}


def send_queue(server_port: int, client_port: int) -> int | None:
    """Bytes in the server's kernel send queue to the client (``/proc/net/tcp``)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, queues = fields[1], fields[2], fields[4]
            if (int(local.rsplit(":", 1)[1], 16) == server_port
                    and int(remote.rsplit(":", 1)[1], 16) == client_port):
                return int(queues.split(":")[0], 16)
    return None


def stuck_reader(url: str, model: str, max_tokens: int) -> socket.socket:
    """A connection that sends a streamed request and never reads."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    # An Ethernet-sized MSS, as from a remote client: loopback's 64 KiB one lets the server's
    # kernel grow its send buffer to megabytes before a write has to wait.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1460)
    sock.connect((host, int(port)))
    body = json.dumps(chat_body(model, max_tokens, **STUCK_EXTRA)).encode()
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                 .encode() + body)
    return sock


async def wait_stuck(server_port: int, client_port: int, within_s: float) -> int:
    """Until the server's kernel holds bytes for the stuck client (its window is closed) and
    has taken no more for 5 s (its send buffer is full), then 5 s more for aiohttp's own
    buffer to fill; the bytes the kernel holds."""
    best, since, t0 = 0, time.monotonic(), time.monotonic()
    while not best or time.monotonic() - since < 5:
        size = send_queue(server_port, client_port) or 0
        if size > best:
            best, since = size, time.monotonic()
        if time.monotonic() - t0 > within_s:
            raise RuntimeError(f"the server's send buffer never filled ({best} bytes)")
        await asyncio.sleep(0.1)
    await asyncio.sleep(5)
    return best


async def main(args: argparse.Namespace) -> None:
    server = Server(args.write_timeout_s, args.num_threads).start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
            model = await wait_ready(http, server.url)
            server_port = int(server.url.rsplit(":", 1)[1])
            await measure(http, server.url, model, args.streams, 16, fifth=True)  # warm-up
            rows = []
            for label, fifth in (("baseline", False), ("+1 reader", True)):
                recs = await measure(http, server.url, model, args.streams, args.max_tokens,
                                     fifth)
                rows.append(summary(label, recs))
            stuck = stuck_reader(server.url, model, args.stuck_tokens)
            try:
                queued = await wait_stuck(server_port, stuck.getsockname()[1],
                                          args.stuck_timeout_s)
                start = time.monotonic()
                recs = await measure(http, server.url, model, args.streams, args.max_tokens,
                                     fifth=False)
                rows.append(summary("+1 stuck", recs))
                end = time.monotonic()
                deadline = end + args.write_timeout_s + 30
                while server.first("client stopped reading") is None:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the stuck reader was never aborted:\n"
                                           + server.log())
                    await asyncio.sleep(0.2)
            finally:
                stuck.close()
    except BaseException:
        print(server.log(), file=sys.stderr)
        raise
    finally:
        server.stop()
    aborted = server.first("client stopped reading")
    assert aborted is not None
    behind_since = aborted - args.write_timeout_s
    print(f"\n{args.streams} streams x {args.max_tokens} tokens, model {model}; the server's "
          f"kernel held {queued} bytes for the stuck reader when run 3 started")
    print(f"the stuck stream's writes waited from {behind_since - start:+.1f} s until its abort "
          f"at {aborted - start:+.1f} s (run 3: 0 to {end - start:.1f} s): "
          + ("behind throughout run 3" if behind_since <= start else
             "NOT behind throughout run 3"))
    print("\n| run | ITL p50 (ms) | ITL p99 (ms) | TTFT p50 (ms) | tokens/s (N streams) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['label']} | {r['itl_p50']:.1f} | {r['itl_p99']:.1f} | "
              f"{r['ttft_p50']:.0f} | {r['tok_s']:.1f} |")
    print(f"\n{cpu_line()}; load average {os.getloadavg()[0]:.2f} at the end; server torch "
          f"threads: {args.num_threads or 'default'}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=4, help="normal streams (N)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per normal stream")
    p.add_argument("--stuck-tokens", type=int, default=7900,
                   help="the stuck request's max_tokens: it must still run in run 3")
    p.add_argument("--stuck-timeout-s", type=float, default=300.0,
                   help="most seconds to wait for the stuck reader's buffers to fill")
    p.add_argument("--num-threads", type=int, default=None,
                   help="the server's torch threads (default: torch's, one per core)")
    p.add_argument("--write-timeout-s", type=float, default=60.0,
                   help="the server's write_timeout_s: longer than run 3 takes")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
