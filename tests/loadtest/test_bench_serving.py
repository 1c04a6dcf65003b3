"""bench_serving: the SSE client on canned streams, the statistics and /metrics parsing, the
plots, and one small sweep end to end against a real hermes_async server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from bench_plots import plot_results
from bench_serving import main
from openai_stream import SSEDecoder, stream_chat
from serving_config import BenchConfig, api_root
from serving_metrics import parse_prefix_counters, prefix_hit_rate
from serving_report import format_table
from serving_stats import summarize
from serving_sweep import run_benchmark, sweep_points

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def chunk(content: str | None = None, **extra) -> bytes:
    delta = {} if content is None else {"content": content}
    body = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}],
            **extra}
    return f"data: {json.dumps(body)}\n\n".encode()


ROLE = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'
USAGE = chunk(choices=[], usage={"prompt_tokens": 40, "completion_tokens": 3,
                                 "prompt_tokens_details": {"cached_tokens": 32}})


async def canned_server(parts: list[bytes]) -> tuple[web.AppRunner, str]:
    """A server whose chat endpoint streams ``parts`` (10 ms apart) and closes."""
    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for p in parts:
            await resp.write(p)
            await asyncio.sleep(0.01)
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1/chat/completions"


async def stream_canned(parts: list[bytes]):
    runner, url = await canned_server(parts)
    try:
        async with aiohttp.ClientSession() as s:
            return await stream_chat(s, url, {"stream": True}, index=3, meta={"k": 1})
    finally:
        await runner.cleanup()


async def test_stream_chat_times_content_chunks():
    rec = await stream_canned([ROLE, b": keep-alive\n\n", chunk("Hel"), chunk("lo"),
                               chunk("!"), USAGE, b"data: [DONE]\n\n"])
    assert rec.error is None and rec.text == "Hello!" and rec.chunks == 3
    assert rec.ttft is not None and 0 < rec.ttft < rec.e2e
    assert len(rec.itls) == 2 and all(x > 0.005 for x in rec.itls)
    assert (rec.prompt_tokens, rec.cached_tokens, rec.output_tokens) == (40, 32, 3)
    assert rec.index == 3 and rec.meta == {"k": 1}


async def test_stream_chat_reports_incomplete_and_error_streams():
    cut = await stream_canned([chunk("a"), chunk("b")])
    assert cut.error is not None and cut.error.startswith("incomplete stream")
    assert cut.output_tokens == 2 and cut.cached_tokens is None
    err = await stream_canned([chunk("a"), b'data: {"error": {"message": "boom"}}\n\n',
                               b"data: [DONE]\n\n"])
    assert err.error is not None and "boom" in err.error


async def test_stream_chat_empty_answer_has_a_first_token():
    finish = chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])
    rec = await stream_canned([ROLE, finish, USAGE, b"data: [DONE]\n\n"])
    assert rec.error is None and rec.chunks == 0 and rec.text == ""
    assert rec.ttft is not None and rec.itls == [] and rec.finish_reason == "stop"


async def test_rate_and_duration_modes_without_metrics():
    parts = [ROLE, chunk("a"), chunk("b"), USAGE, b"data: [DONE]\n\n"]
    runner, url = await canned_server(parts)
    base = url.removesuffix("/chat/completions")
    try:
        rate = await run_benchmark(BenchConfig(base_url=base, model="m", request_rate=[50.0],
                                               num_requests=5, warmup=1, label="canned"))
        timed = await run_benchmark(BenchConfig(base_url=base, model="m", concurrency=[2],
                                                num_requests=None, duration_s=0.3, warmup=0))
    finally:
        await runner.cleanup()
    s = rate["points"][0]["summary"]
    assert rate["points"][0]["point"] == {"request_rate": 50.0}
    assert (s["completed"], s["errors"], s["output_tokens_mean"]) == (5, 0, 3)
    assert s["cached_share"] == pytest.approx(0.8) and s["server_prefix_hit_rate"] is None
    recs = rate["points"][0]["records"]
    assert [r["index"] for r in recs] == [0, 1, 2, 3, 4]  # within the point
    assert [r["meta"]["index"] for r in recs] == [1, 2, 3, 4, 5]  # the workload's (1 warm-up)
    t = timed["points"][0]["summary"]
    assert t["completed"] >= 2 and t["errors"] == 0 and t["duration_s"] >= 0.3


def test_sse_decoder_splits_and_joins():
    d = SSEDecoder()
    assert d.feed(b"data: {\"a\"") == []
    assert d.feed(b": 1}\n\n: comment\n\ndata: x\r\ndata: y\n\ndata: [DONE]") == [
        '{"a": 1}', "x\ny"]
    assert d.close() == ["[DONE]"]


HERMES_METRICS = """\
# TYPE hermes_prefix_cache_queries counter
hermes_prefix_cache_queries_total{namespace="a"} 100.0
hermes_prefix_cache_queries_total{namespace="b"} 50.0
# TYPE hermes_prefix_cache_hits counter
hermes_prefix_cache_hits_total{namespace="a"} 64.0
hermes_prefix_cache_hits_total{namespace="b"} 32.0
"""
VLLM_METRICS = """\
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
"""


def test_prefix_counters_of_hermes_and_vllm():
    h = parse_prefix_counters(HERMES_METRICS)
    assert h == {"source": "hermes_async", "queries": 150.0, "hits": 96.0}
    v = parse_prefix_counters(VLLM_METRICS)
    assert v == {"source": "vllm", "queries": 1000.0, "hits": 250.0}
    assert parse_prefix_counters("# nothing\nother_metric 1\n") is None
    after = {"queries": 250.0, "hits": 176.0}
    assert prefix_hit_rate(h, after) == pytest.approx(0.8)
    assert prefix_hit_rate(None, after) is None and prefix_hit_rate(h, h) is None


def record(i: int, ttft: float, cached: int | None, error: str | None = None) -> dict:
    return {"index": i, "meta": {}, "start": i * 0.5, "ttft": ttft, "itls": [0.01, 0.03],
            "e2e": ttft + 0.04, "output_tokens": 3, "prompt_tokens": 100,
            "cached_tokens": cached, "chunks": 3, "finish_reason": "length", "error": error}


def test_summarize():
    recs = [record(0, 0.2, 0), record(1, 0.1, 96), record(2, 0.1, None),
            record(3, 0.0, None, error="HTTP 500: x")]
    s = summarize(recs, duration_s=2.0)
    assert (s["requests"], s["completed"], s["errors"]) == (4, 3, 1)
    assert s["error_samples"] == ["HTTP 500: x"]
    assert s["ttft_ms"]["p50"] == pytest.approx(100) and s["ttft_ms"]["mean"] == pytest.approx(
        400 / 3)
    assert s["itl_ms"]["p50"] == pytest.approx(20)
    assert s["request_throughput"] == 1.5 and s["output_throughput"] == 4.5
    assert s["cached_share"] == pytest.approx(96 / 200)
    assert summarize(recs[:2])["duration_s"] == pytest.approx(0.5 + 0.14)
    assert summarize([])["ttft_ms"]["p50"] is None


def test_sweep_points_and_urls():
    cfg = BenchConfig(workload="prefix_share", shares=[0.0, 0.5], concurrency=[1, 4])
    assert sweep_points(cfg) == [{"share": 0.0, "concurrency": 1}, {"share": 0.0,
                                 "concurrency": 4}, {"share": 0.5, "concurrency": 1},
                                 {"share": 0.5, "concurrency": 4}]
    assert sweep_points(BenchConfig(request_rate=[2.0])) == [{"request_rate": 2.0}]
    assert sweep_points(BenchConfig()) == [{"concurrency": 1}]
    assert api_root("http://h:1") == ("http://h:1/v1", "http://h:1")
    assert api_root("http://h:1/v1/") == ("http://h:1/v1", "http://h:1")
    with pytest.raises(ValueError):
        BenchConfig(concurrency=[1], request_rate=[1.0])


def fake_run(label: str, points: list[tuple[dict, float]]) -> dict:
    return {"label": label, "points": [
        {"point": p, "summary": summarize([record(0, t, 50), record(1, t, 50)], 1.0)}
        for p, t in points]}


def test_plots_of_several_servers(tmp_path: Path):
    runs = [fake_run(name, [({"share": s, "concurrency": 1}, 0.3 * (1 - s) + k)
                            for s in (0.0, 0.5, 0.9)]) for k, name in enumerate(("a", "b"))]
    runs += [fake_run("a", [({"concurrency": c}, 0.1 * c) for c in (1, 4, 16)]),
             fake_run("r", [({"request_rate": r}, 0.1) for r in (1.0, 2.0)])]
    paths = plot_results(runs, tmp_path)
    assert {p.name for p in paths} == {"throughput.png", "throughput_rate.png",
                                       "ttft_vs_share.png"}
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in paths)
    assert plot_results([fake_run("x", [])], tmp_path / "none") == []
    assert "share=0.5 c=1" in format_table(runs)


@pytest.mark.slow
async def test_bench_serving_against_hermes(loadtest_server, tmp_path: Path, capsys):
    cfg = BenchConfig(base_url=loadtest_server.base_url, workload="shared_system",
                      workload_params={"system_tokens": 200}, concurrency=[1, 4],
                      num_requests=4, max_tokens=4, warmup=1, label="hermes_async",
                      out=str(tmp_path / "hermes.json"), plot_dir=str(tmp_path / "plots"))
    result = await run_benchmark(cfg)
    assert result["model"] == "SmolLM2-135M-Instruct"
    assert [p["point"] for p in result["points"]] == [{"concurrency": 1}, {"concurrency": 4}]
    for p in result["points"]:
        s = p["summary"]
        assert s["errors"] == 0 and s["completed"] == 4 and len(p["records"]) == 4
        assert s["ttft_ms"]["p50"] > 0 and s["itl_ms"]["p50"] > 0
        assert s["output_throughput"] > 0 and s["request_throughput"] > 0
        assert s["cached_share"] > 0.5  # 200 shared tokens of about 250
        assert s["metrics_source"] == "hermes_async" and s["server_prefix_hit_rate"] > 0.5
        steps = s["server_steps"]  # hermes step histograms: >= 4 tokens, one step each
        assert steps["steps"] >= 4
        assert 0 < steps["forward_share"] <= 1.05 and steps["seqs_per_step"] >= 1
        assert all(r["prompt_tokens"] and r["output_tokens"] for r in p["records"])
    saved = json.loads((tmp_path / "hermes.json").read_text())
    assert saved["config"]["workload"] == "shared_system" and len(saved["points"]) == 2
    png = tmp_path / "plots" / "throughput.png"
    assert png.read_bytes().startswith(PNG_MAGIC)
    main(["--compare", str(tmp_path / "hermes.json"), str(tmp_path / "hermes.json"),
          "--plot-dir", str(tmp_path / "cmp")])
    assert "hermes_async" in capsys.readouterr().out
    assert (tmp_path / "cmp" / "throughput.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.slow
async def test_bench_serving_counts_errors(loadtest_server):
    cfg = BenchConfig(base_url=loadtest_server.url, model="no-such-model", num_requests=3,
                      warmup=0, max_tokens=2)
    result = await run_benchmark(cfg)
    s = result["points"][0]["summary"]
    assert (s["errors"], s["completed"]) == (3, 0)
    assert s["error_samples"][0].startswith("HTTP 404")
