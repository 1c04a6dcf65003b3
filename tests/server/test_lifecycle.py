"""Engine life cycle through HTTP, on the torch-free FakeRunner (fast): 503 while the model
loads and after a failed load, 200 when ready, 503 once shutting down; a failing model step
(500 / an error event in a stream), the request timeout (504) and keep-alive comments."""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
import pytest

from hermes_async.config import CacheConfig, EngineConfig, SchedulerConfig, ServerConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.server import wait_until_ready
from tests.engine.fake_runner import EOS, FakeRunner, fake_output_text
from tests.server.helpers import ServerThread, engine_idle, request, request_json

PROMPT = {"model": "fake", "prompt": [5, 6, 7, 8, 9], "max_tokens": 8}


class SlowRunner(FakeRunner):
    """Each step takes ``delay_s`` (in the engine's worker thread)."""

    delay_s: float = 0.0

    def execute(self, steps):
        time.sleep(self.delay_s)
        return super().execute(steps)


class GatedEngine(AsyncEngine):
    """Its start (the "model load") waits for ``gate``; ``fail`` makes it raise."""

    def __init__(self, *args, fail: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()
        self.fail = fail

    async def start(self) -> None:
        await self.gate.wait()
        if self.fail:
            raise FileNotFoundError("no model here")
        await super().start()


def fake_server(fail: bool = False, scheduler: dict | None = None, **server) -> ServerThread:
    cfg = EngineConfig(cache=CacheConfig(block_size=4),
                       scheduler=SchedulerConfig(**(scheduler or {})),
                       server=ServerConfig(served_model_name="fake", **server))

    def make() -> AsyncEngine:
        return GatedEngine(cfg, runner=SlowRunner(), tokenizer=object(), eos_token_ids=[EOS],
                           output_text=fake_output_text, fail=fail)

    return ServerThread(cfg, make).start(wait_ready=False)


def error_of(result, status):
    got, headers, body = result
    assert got == status, body
    return headers, body["error"]


def open_gate(srv: ServerThread) -> None:
    srv.call(srv.engine.gate.set)
    srv.run(wait_until_ready(srv.app))


def test_503_until_loaded_then_ready_then_503_shutting_down():
    srv = fake_server()
    try:
        headers, err = error_of(request_json(f"{srv.url}/health"), 503)
        assert err["code"] == "model_loading" and headers["Retry-After"] == "1"
        assert err["type"] == "service_unavailable_error"
        _, err = error_of(request_json(f"{srv.url}/v1/completions", PROMPT), 503)
        assert err["code"] == "model_loading"
        assert request(f"{srv.url}/metrics")[0] == 200
        open_gate(srv)
        assert request_json(f"{srv.url}/health")[2] == {"status": "ok"}
        status, _, body = request_json(f"{srv.url}/v1/completions", PROMPT)
        assert status == 200 and body["usage"]["completion_tokens"] == 8
        assert body["model"] == "fake"
        srv.run(srv.engine.stop())
        for path, body in (("/health", None), ("/v1/completions", PROMPT)):
            _, err = error_of(request_json(f"{srv.url}{path}", body), 503)
            assert err["code"] == "shutting_down"
    finally:
        srv.stop()


def test_503_after_a_failed_load():
    srv = fake_server(fail=True)
    try:
        srv.call(srv.engine.gate.set)
        with pytest.raises(FileNotFoundError):
            srv.run(wait_until_ready(srv.app))
        for path, body in (("/health", None), ("/v1/completions", PROMPT)):
            _, err = error_of(request_json(f"{srv.url}{path}", body), 503)
            assert err["code"] == "model_load_failed" and "no model here" in err["message"]
    finally:
        srv.stop()


def test_failed_step_is_500_or_an_error_event_and_the_server_recovers():
    srv = fake_server()
    try:
        open_gate(srv)
        srv.engine.runner.fail_rate = 1.0
        _, err = error_of(request_json(f"{srv.url}/v1/completions", PROMPT), 500)
        assert err["code"] == "engine_error" and err["type"] == "server_error"
        status, _, raw = request(f"{srv.url}/v1/completions", {**PROMPT, "stream": True})
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
        events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
        assert msgspec.json.decode(events[-1][6:])["error"]["code"] == "engine_error"
        srv.engine.runner.fail_rate = 0.0
        assert request_json(f"{srv.url}/v1/completions", PROMPT)[0] == 200
        assert srv.call(lambda: engine_idle(srv.engine))["requests"] == 0
        metrics = request(f"{srv.url}/metrics")[2].decode()
        assert 'hermes_request_errors_total{code="engine_error"}' in metrics
    finally:
        srv.stop()


def test_request_timeout_504_and_keepalive_comments():
    srv = fake_server(request_timeout_s=0.4, keepalive_interval_s=0.005)
    try:
        open_gate(srv)
        srv.engine.runner.delay_s = 0.02  # 200 tokens: 4 s, far over the timeout
        slow = {**PROMPT, "max_tokens": 200}
        t0 = time.monotonic()
        _, err = error_of(request_json(f"{srv.url}/v1/completions", slow), 504)
        assert err["code"] == "request_timeout" and time.monotonic() - t0 < 2.0
        status, _, raw = request(f"{srv.url}/v1/completions", {**slow, "stream": True})
        assert status == 200 and b": keep-alive\n\n" in raw
        last = [e for e in raw.split(b"\n\n") if e.startswith(b"data: {")][-1]
        assert msgspec.json.decode(last[6:])["error"]["code"] == "request_timeout"
        assert raw.endswith(b"data: [DONE]\n\n")
        idle = {"requests": 0, "running": 0, "waiting": 0, "pinned": 0, "private": 0}
        assert srv.call(lambda: engine_idle(srv.engine)) == idle  # aborted, not finished
    finally:
        srv.stop()


def test_shutdown_drains_in_flight_requests():
    srv = fake_server(shutdown_drain_s=10.0)
    open_gate(srv)
    srv.engine.runner.delay_s = 0.01
    result: list = []
    client = threading.Thread(target=lambda: result.append(request(
        f"{srv.url}/v1/completions", {**PROMPT, "max_tokens": 60, "stream": True})))
    client.start()
    while srv.call(lambda: srv.engine.load().requests) == 0:
        time.sleep(0.01)
    srv.stop()  # graceful: the stream in flight finishes first, then the engine stops
    client.join(10)
    status, _, raw = result[0]
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    finishes = [msgspec.json.decode(e[6:])["choices"][0]["finish_reason"]
                for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    assert finishes[-1] == "length"


def test_429_when_too_many_requests_wait():
    srv = fake_server(scheduler={"max_num_seqs": 1, "max_waiting": 1}, retry_after_s=2)
    try:
        open_gate(srv)
        srv.engine.runner.delay_s = 0.02
        results: list = []
        body = {**PROMPT, "max_tokens": 25}
        threads = [threading.Thread(target=lambda: results.append(
            request(f"{srv.url}/v1/completions", body))) for _ in range(2)]
        for i, th in enumerate(threads):  # one running, then one waiting
            th.start()
            while srv.call(lambda: srv.engine.load().requests) <= i:
                time.sleep(0.005)
        headers, err = error_of(request_json(f"{srv.url}/v1/completions", PROMPT), 429)
        assert err["code"] == "queue_full" and headers["Retry-After"] == "2"
        for th in threads:
            th.join(10)
        assert [r[0] for r in results] == [200, 200]
        assert request_json(f"{srv.url}/v1/completions", PROMPT)[0] == 200
    finally:
        srv.stop()
