"""The ASGI front end (``hermes_async.asgi``) under uvicorn, on the torch-free FakeRunner with a
tiny locally built tokenizer (chat template included): the official ``openai`` client for
chat (plain and streamed) and completions, raw HTTP for the error objects (401, 404, 405 with
``Allow``, 408, 413), the SSE framing, the probes and the dashboard; clients that disconnect
mid-request leave the engine idle. Then the app driven directly as an ASGI callable: the
lifespan protocol, a client that stops reading, the scope helpers."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import openai
import pytest
import uvicorn

from hermes_async.asgi import ASGIApp
from hermes_async.asgi.messages import query_of, route_path
from hermes_async.config import CacheConfig, EngineConfig, ServerConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.openai import ServiceState
from hermes_async.prompt import PromptAssembler
from tests.engine.fake_runner import EOS, fake_output_text, reference_tokens
from tests.prompt.conftest import build_llama_tokenizer
from tests.server.helpers import ServerThread, engine_idle, request, request_json
from tests.server.test_lifecycle import SlowRunner
from tests.server.test_slow_clients import connect, post_head, read_to_close, split_response

KEY = "sk-a"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = [5, 6, 7, 8, 9]
MAX_LEN = 8192
IDLE = {"requests": 0, "running": 0, "waiting": 0, "pinned": 0, "private": 0}
LONG = {"model": "fake", "prompt": PROMPT, "max_tokens": 4000, "ignore_eos": True}
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6}


def fake_config(**server: Any) -> EngineConfig:
    return EngineConfig(cache=CacheConfig(block_size=4), server=ServerConfig(
        served_model_name="fake", api_keys={KEY: "team-a"}, **server))


def fake_engine(cfg: EngineConfig, tokenizer: Any) -> AsyncEngine:
    """The FakeRunner (1 ms a step: a 4000-token request takes seconds) with a chat template."""
    runner = SlowRunner(max_model_len=MAX_LEN, num_blocks=MAX_LEN // 4 + 64)
    runner.delay_s = 0.001
    return AsyncEngine(cfg, runner=runner, tokenizer=tokenizer, eos_token_ids=[EOS],
                       output_text=fake_output_text, assembler=PromptAssembler(tokenizer))


def fake_text(n: int) -> str:
    return "".join(f"<{t}>" for t in reference_tokens(PROMPT, n))


class UvicornThread(ServerThread):
    """:class:`ASGIApp` under ``uvicorn.Server`` (lifespan on) in the helper's background
    thread and loop; ``app`` is the ASGIApp, ``state`` its ServiceState."""

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        assert self.make_engine is not None
        self.app = ASGIApp(ServiceState.of(self.config, self.make_engine()))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        server = uvicorn.Server(uvicorn.Config(self.app, lifespan="on", log_level="warning",
                                               timeout_graceful_shutdown=5))
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            assert not serving.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            server.should_exit = True
            await serving

    @property
    def state(self) -> ServiceState:
        return self.app.state

    def start(self, wait_ready: bool = True) -> UvicornThread:
        super().start(wait_ready=False)
        if wait_ready:
            self.run(self.state.wait_until_ready(), timeout=60)
        return self


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_llama_tokenizer()


@pytest.fixture(scope="module")
def srv(tokenizer):
    cfg = fake_config(max_body_bytes=4096, body_read_timeout_s=0.5)
    s = UvicornThread(cfg, lambda: fake_engine(cfg, tokenizer)).start()
    yield s
    s.stop()
    assert not s.engine.is_running  # lifespan shutdown stopped it (its integrity check ran)


def client(srv: UvicornThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0, timeout=30)


def wait_for(srv: UvicornThread, done: Callable[[], bool], within_s: float, what: str) -> None:
    """Poll ``done`` on the server's loop until it holds; fails after ``within_s``."""
    t0 = time.monotonic()
    while not srv.call(done):
        assert time.monotonic() - t0 < within_s, what
        time.sleep(0.02)


def wait_idle(srv: UvicornThread, within_s: float = 2.0) -> None:
    """The engine idle within ``within_s`` (a 4000-token request would still be running)."""
    wait_for(srv, lambda: engine_idle(srv.engine) == IDLE, within_s, "request not aborted")
    srv.call(srv.engine.check_integrity)


def assert_error(result: tuple[int, dict[str, str], Any], status: int, code: str) -> dict:
    got, headers, body = result
    assert got == status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code, body
    return headers


# ----- under uvicorn --------------------------------------------------------------------------
def test_openai_client_chat_streamed_chat_and_completions(srv):
    with client(srv) as c:
        assert [m.id for m in c.models.list().data] == ["fake"]
        chat = c.chat.completions.create(**CHAT)
        (choice,) = chat.choices
        assert choice.finish_reason == "length" and chat.usage.completion_tokens == 6
        assert choice.message.role == "assistant" and choice.message.content.count("<") == 6
        stream = c.chat.completions.create(**CHAT, stream=True)
        chunks = list(stream)
        assert chunks[-1].choices[0].finish_reason == "length"
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == choice.message.content  # the fake runner is deterministic
        done = c.completions.create(model="fake", prompt=PROMPT, max_tokens=8)
        assert done.choices[0].text == fake_text(8)
        assert done.usage.prompt_tokens == 5 and done.usage.completion_tokens == 8
    wait_idle(srv)


def test_raw_sse_ends_with_done(srv):
    status, headers, raw = request(f"{srv.url}/v1/completions", {
        "model": "fake", "prompt": PROMPT, "max_tokens": 5, "stream": True}, headers=AUTH)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert headers["cache-control"] == "no-cache"
    assert raw.endswith(b"data: [DONE]\n\n")
    events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    pieces = [json.loads(e[6:])["choices"][0]["text"] for e in events]
    assert "".join(pieces) == fake_text(5)


def test_401_404_405_error_objects(srv):
    headers = assert_error(request_json(f"{srv.url}/v1/completions", {"prompt": PROMPT}),
                           401, "invalid_api_key")
    assert headers["www-authenticate"].startswith("Bearer")
    assert_error(request_json(f"{srv.url}/v1/models", headers={"Authorization": "Bearer no"}),
                 401, "invalid_api_key")
    assert_error(request_json(f"{srv.url}/nothing"), 404, "not_found")
    assert_error(request_json(f"{srv.url}/v1/nothing", headers=AUTH), 404, "not_found")
    headers = assert_error(request_json(f"{srv.url}/v1/completions", headers=AUTH), 405,
                           "method_not_allowed")
    assert headers["allow"] == "POST"
    headers = assert_error(request_json(f"{srv.url}/health", {}), 405, "method_not_allowed")
    assert headers["allow"] == "GET, HEAD"
    text = request(f"{srv.url}/metrics")[2].decode()
    for code in ("invalid_api_key", "not_found", "method_not_allowed"):
        assert f'hermes_request_errors_total{{code="{code}"}}' in text, code


def test_413_announced_or_streamed_and_408_stalled_body(srv):
    big = {"model": "fake", "prompt": "x" * 5000}
    status, _, body = request_json(f"{srv.url}/v1/completions", big, headers=AUTH)
    assert status == 413 and "body (5031 bytes) is larger" in body["error"]["message"]
    chunks = (b" " * 1000 for _ in range(5))  # chunked: the limit is found while reading
    status, _, body = request_json(f"{srv.url}/v1/completions", raw=chunks, headers=AUTH)
    assert status == 413 and "body is larger than the limit of 4096" in body["error"]["message"]
    with connect(srv) as sock:  # 100 bytes announced, 10 sent, then nothing
        sock.sendall(post_head("/tokenize", 100).replace(b"\r\n\r\n", b"\r\n")
                     + f"Authorization: Bearer {KEY}\r\n\r\n".encode() + b'{"prompt":')
        status, headers, body = split_response(read_to_close(sock))  # closed after it
        assert status == 408 and headers["connection"] == "close"
        assert json.loads(body)["error"]["code"] == "request_timeout"
    assert request(f"{srv.url}/health")[0] == 200


def test_probes_models_and_dashboard(srv):
    status, _, body = request_json(f"{srv.url}/health")
    assert (status, body) == (200, {"status": "ok"})
    status, headers, raw = request(f"{srv.url}/health", method="HEAD")
    assert status == 200 and raw == b"" and int(headers["content-length"]) > 0
    status, headers, raw = request(f"{srv.url}/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert b"hermes_kv_blocks_referenced" in raw
    status, _, body = request_json(f"{srv.url}/v1/models", headers=AUTH)
    assert status == 200 and [m["id"] for m in body["data"]] == ["fake"]
    status, headers, raw = request(f"{srv.url}/dashboard")
    page = resources.files("hermes_async").joinpath("server/static/dashboard.html")
    assert status == 200 and raw == page.read_bytes()
    assert headers["content-type"] == "text/html; charset=utf-8"
    assert "script-src 'sha256-" in headers["content-security-policy"]


def test_a_client_gone_mid_stream_aborts_its_request(srv):
    with connect(srv) as sock:
        body = json.dumps({**LONG, "stream": True}).encode()
        sock.sendall(post_head("/v1/completions", len(body)).replace(b"\r\n\r\n", b"\r\n")
                     + f"Authorization: Bearer {KEY}\r\n\r\n".encode() + body)
        seen = b""
        while seen.count(b"data: {") < 3:
            seen += sock.recv(65536)
        assert seen.startswith(b"HTTP/1.1 200")
        assert srv.call(lambda: srv.engine.load().requests) == 1
    wait_idle(srv)


def test_a_client_gone_before_its_answer_aborts_its_request(srv):
    with connect(srv) as sock:
        body = json.dumps(LONG).encode()
        sock.sendall(post_head("/v1/completions", len(body)).replace(b"\r\n\r\n", b"\r\n")
                     + f"Authorization: Bearer {KEY}\r\n\r\n".encode() + body)
        wait_for(srv, lambda: srv.engine.load().requests == 1, 10, "never started")
    wait_idle(srv)
    assert request(f"{srv.url}/health")[0] == 200


# ----- the ASGI callable driven directly --------------------------------------------------------
class Lifespan:
    """A server's side of the lifespan protocol."""

    def __init__(self, app: ASGIApp) -> None:
        self.inbox: asyncio.Queue[dict] = asyncio.Queue()
        self.outbox: asyncio.Queue[dict] = asyncio.Queue()
        self.task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}},
                                            self.inbox.get, self.outbox.put))

    async def phase(self, name: str) -> str:
        await self.inbox.put({"type": f"lifespan.{name}"})
        return (await asyncio.wait_for(self.outbox.get(), 30))["type"]


def http_scope(path: str, method: str = "POST") -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "path": path, "root_path": "", "query_string": b"",
            "headers": [(b"authorization", f"Bearer {KEY}".encode())]}


async def test_lifespan_starts_and_stops_the_engine_or_leaves_it(tokenizer):
    cfg = fake_config()
    app = ASGIApp(ServiceState.of(cfg, fake_engine(cfg, tokenizer)))
    life = Lifespan(app)
    assert await life.phase("startup") == "lifespan.startup.complete"
    await app.state.wait_until_ready()
    assert app.state.engine.is_running
    assert await life.phase("shutdown") == "lifespan.shutdown.complete"
    await life.task
    assert not app.state.engine.is_running and app.state.stopping
    owned = ASGIApp(ServiceState.of(cfg, fake_engine(cfg, tokenizer)), manage_lifecycle=False)
    life = Lifespan(owned)
    assert await life.phase("startup") == "lifespan.startup.complete"
    assert await life.phase("shutdown") == "lifespan.shutdown.complete"
    assert owned.state.start_task is None and not owned.state.stopping


async def test_a_client_that_stops_reading_ends_its_stream(tokenizer, caplog):
    """Its third send never returns: after ``write_timeout_s`` the app returns without
    completing the response, the stream closed (engine idle)."""
    cfg = fake_config(write_timeout_s=0.3)
    app = ASGIApp(ServiceState.of(cfg, fake_engine(cfg, tokenizer)))
    app.state.start()
    await app.state.wait_until_ready()
    sent: list[dict] = []
    stuck = asyncio.Event()

    async def send(message: dict) -> None:
        sent.append(message)
        if len(sent) >= 3:
            await stuck.wait()

    body = json.dumps({**LONG, "stream": True}).encode()
    messages = iter([{"type": "http.request", "body": body, "more_body": False}])

    async def receive() -> dict:
        return next(messages, None) or await stuck.wait()  # never disconnects

    t0 = time.monotonic()
    await asyncio.wait_for(app(http_scope("/v1/completions"), receive, send), 5)
    assert 0.3 <= time.monotonic() - t0 < 3
    assert sent[0]["status"] == 200 and all(m.get("more_body", True) for m in sent)
    assert "client stopped reading for 0.3 s" in caplog.text
    load = app.state.engine.load()
    assert (load.requests, load.blocks.referenced, load.blocks.private) == (0, 0, 0)
    await app.state.stop()


def test_route_path_and_query():
    assert route_path({"path": "/llm/v1/models", "root_path": "/llm"}) == "/v1/models"
    assert route_path({"path": "/v1/models", "root_path": "/llm"}) == "/v1/models"
    assert route_path({"path": "/llm", "root_path": "/llm/"}) == "/"
    assert route_path({"path": "/llmx/health", "root_path": "/llm"}) == "/llmx/health"
    assert query_of({"query_string": b"namespace=a%20b&namespace=c&empty="}) == {
        "namespace": "a b", "empty": ""}


def test_the_front_end_imports_no_aiohttp():
    code = ("import sys, hermes_async.asgi; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp' "
            "or m.startswith('hermes_async.server')); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
