"""Slow and stuck clients (issue 17) on a torch-free fake runner, over raw sockets.

- A client that stops reading its stream (a small receive buffer, never a ``recv``) fills its
  TCP window and the server's buffers; the engine keeps queueing its outputs and keeps serving
  other streams to the end; once a write has waited ``server.write_timeout_s`` the connection
  is aborted, the engine requests with it (nothing running, no KV block held) and a warning
  says why. The same for a non-streaming response too large for the buffers.
- A body that does not arrive within ``server.body_read_timeout_s`` (stalled or trickling)
  gets 408 ``request_timeout`` and the connection is closed.
- A request line past its configured limit gets 414 ``uri_too_long``, a header field or
  header count past its limit 431 ``request_header_fields_too_large`` (OpenAI error objects,
  counted, the connection closed); past aiohttp's own hard caps, its plain-text 400.

After each, the server still answers ``/health`` and the engine is idle. The only times
asserted are the timeouts configured here (as upper bounds for the waits).
"""

from __future__ import annotations

import asyncio
import json
import logging
import select
import socket
import time
from urllib.parse import urlsplit

import pytest

from hermes_async.config import CacheConfig, ConfigError, EngineConfig, ServerConfig, from_dict
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.engine.request import EngineRequest
from hermes_async.server.head import parser_limits
from hermes_async.server.respond import ClientStoppedReading, Pull, WriteClock
from hermes_async.step import SampledToken
from hermes_async.types import FinishReason
from tests.engine.fake_runner import EOS, FakeDelta, FakeRunner
from tests.server.helpers import ServerThread, engine_idle, request, request_json

IDLE = {"requests": 0, "running": 0, "waiting": 0, "pinned": 0, "private": 0}
PIECE = "x" * 1024  # each token's text: a 1 KiB SSE event fills the buffers in a few thousand
MAX_LEN = 1 << 16


class WideRunner(FakeRunner):
    """Every sampled token is 7, in O(1) per step (the base rebuilds each context)."""

    def execute(self, steps):
        self.steps += 1
        time.sleep(0.0002)  # a step is never free; leaves the loop its share of the GIL
        return [None if s.sampling is None else SampledToken(7) for s in steps]


class WideText:
    """Each token reads as :data:`PIECE`; no stop strings."""

    def append(self, token: int) -> FakeDelta:
        return FakeDelta(PIECE, False)

    def finish(self) -> FakeDelta:
        return FakeDelta("", False)


def fake_server(**server) -> ServerThread:
    cfg = EngineConfig(cache=CacheConfig(block_size=4),
                       server=ServerConfig(served_model_name="fake", **server))

    def make() -> AsyncEngine:
        runner = WideRunner(max_model_len=MAX_LEN, num_blocks=MAX_LEN // 4 + 256)
        return AsyncEngine(cfg, runner=runner, tokenizer=object(), eos_token_ids=[EOS],
                           output_text=lambda prompt, stops: WideText())

    return ServerThread(cfg, make).start()


@pytest.fixture
def srv():
    s = fake_server(write_timeout_s=1.0, body_read_timeout_s=0.5, max_request_line_bytes=1024,
                    max_header_bytes=1024, max_headers=16)
    yield s
    s.stop()


def completion(max_tokens: int, stream: bool) -> bytes:
    return json.dumps({"model": "fake", "prompt": [5, 6, 7], "max_tokens": max_tokens,
                       "stream": stream, "ignore_eos": True}).encode()


def connect(srv: ServerThread, rcvbuf: int | None = None) -> socket.socket:
    """A raw TCP connection to the server (``rcvbuf``: SO_RCVBUF, set before connecting)."""
    url = urlsplit(srv.url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect((url.hostname, url.port))
    return sock


def post_head(path: str, length: int | None) -> bytes:
    size = (f"Content-Length: {length}" if length is not None
            else "Transfer-Encoding: chunked")
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"{size}\r\n\r\n").encode()


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset after the data
    also ends it: a server closing with unread input resets)."""
    data = b""
    while True:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not part:
            return data
        data += part


def split_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def queued_outputs(srv: ServerThread) -> int:
    """The most engine outputs waiting unread on any request's queue."""
    return srv.call(lambda: max((r.queue.qsize() for r in srv.engine.core.requests.values()),
                                default=0))


def only_request(srv: ServerThread) -> EngineRequest:
    """The one engine request in flight."""
    (req,) = srv.call(lambda: list(srv.engine.core.requests.values()))
    return req


def in_flight(srv: ServerThread) -> int:
    return srv.call(lambda: srv.engine.load().requests)


def wait_for(check, within_s: float, what: str) -> None:
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < within_s, what
        time.sleep(0.02)


def wait_idle(srv: ServerThread, within_s: float) -> None:
    state: dict[str, int] = {}

    def idle() -> bool:
        nonlocal state
        state = srv.call(lambda: engine_idle(srv.engine))
        return state == IDLE

    wait_for(idle, within_s, f"not aborted: {state}")
    srv.call(srv.engine.check_integrity)


def assert_healthy(srv: ServerThread) -> None:
    assert request(f"{srv.url}/health")[0] == 200
    status, _, body = request_json(f"{srv.url}/v1/completions",
                                   json.loads(completion(3, stream=False)))
    assert status == 200 and body["choices"][0]["text"] == PIECE * 3
    wait_idle(srv, 10)


def sse_events(data: bytes) -> list[bytes]:
    return [e[len(b"data: "):] for e in data.split(b"\n\n") if e.startswith(b"data: ")]


# ----- stuck readers ----------------------------------------------------------------------
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-streaming"])
def test_stuck_reader_is_aborted_while_others_stream(srv, caplog, stream):
    caplog.set_level(logging.WARNING, logger="hermes_async.server")
    stuck = connect(srv, rcvbuf=4096)  # and never read from
    try:
        if stream:
            body = completion(MAX_LEN - 16, stream=True)
        else:  # a 6 MiB JSON body, larger than every buffer on the way
            body = completion(6 << 10, stream=False)
        stuck.sendall(post_head("/v1/completions", len(body)) + body)
        if stream:
            # its writes block: the engine keeps producing, its outputs queue up unread
            wait_for(lambda: queued_outputs(srv) > 200, 60, "the stuck stream never blocked")
            req = only_request(srv)
        else:
            wait_for(lambda: in_flight(srv) == 1, 30, "the request never started")
        # another client meanwhile streams to the end
        n = 20
        status, _, data = request(f"{srv.url}/v1/completions",
                                  json.loads(completion(n, stream=True)))
        events = sse_events(data)
        assert status == 200 and events[-1] == b"[DONE]"
        texts = [c["text"] for e in events[:-1] for c in json.loads(e)["choices"]]
        assert "".join(texts) == PIECE * n
        if stream:
            assert in_flight(srv) == 1  # the stuck one was there all along
        # then the stuck one is cut off: engine requests aborted, KV blocks released
        wait_idle(srv, 60)
        if stream:
            assert [q.finish_reason for q in req.sequences] == [FinishReason.ABORT]
        wait_for(lambda: "client stopped reading for 1 s" in caplog.text, 30, "no warning")
        record = next(r for r in caplog.records if "client stopped reading" in r.message)
        assert record.levelno == logging.WARNING and "POST /v1/completions" in record.message
        # its connection is gone (aborted: a reset, or the end of what had been sent)
        stuck.settimeout(10)
        read_to_close(stuck)
    finally:
        stuck.close()
    assert_healthy(srv)


def test_reader_that_falls_behind_is_aborted(srv, caplog):
    """A client that reads, 32 KiB every 50 ms, but more slowly than the stream is produced
    never catches up; once its writes have waited 1 s (in one write or in several: see the
    clock tests below) it is cut off like a stuck one."""
    caplog.set_level(logging.WARNING, logger="hermes_async.server")
    slow = connect(srv, rcvbuf=128 << 10)
    try:
        body = completion(MAX_LEN - 16, stream=True)
        slow.sendall(post_head("/v1/completions", len(body)) + body)
        wait_for(lambda: in_flight(srv) == 1, 30, "the request never started")
        req = only_request(srv)
        received = 0
        slow.settimeout(30)
        while True:
            try:
                part = slow.recv(32 << 10)
            except ConnectionResetError:
                break
            if not part:
                break
            received += len(part)
            time.sleep(0.05)
        wait_idle(srv, 60)
        assert [q.finish_reason for q in req.sequences] == [FinishReason.ABORT]
        assert req.sequences[0].num_output_tokens < MAX_LEN - 16
        assert received > 64 << 10  # it did read, and writes got through
        assert "client stopped reading for 1 s" in caplog.text
    finally:
        slow.close()
    assert_healthy(srv)


# ----- slow bodies ------------------------------------------------------------------------
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_stalled_body_gets_408_and_the_connection_closes(srv, chunked):
    body = completion(3, stream=False)
    with connect(srv) as sock:
        sock.settimeout(5)  # less than aiohttp's lingering read of an unread body (10 s)
        part = body[:10]
        sock.sendall(post_head("/v1/completions", None if chunked else len(body))
                     + (f"{len(part):x}\r\n".encode() + part + b"\r\n" if chunked else part))
        raw = read_to_close(sock)  # the server answers, then closes
    status, headers, payload = split_response(raw)
    assert status == 408, raw
    assert headers["content-type"].startswith("application/json")
    assert headers.get("connection", "").lower() == "close"
    if headers.get("transfer-encoding") != "chunked":
        err = json.loads(payload)["error"]
        assert err["code"] == "request_timeout" and err["type"] == "timeout_error"
        assert "0.5 s" in err["message"]
    status, _, text = request(f"{srv.url}/metrics")
    assert b'hermes_request_errors_total{code="request_timeout"}' in text
    wait_idle(srv, 10)  # nothing was ever submitted
    assert_healthy(srv)


def test_trickling_body_is_cut_off(srv):
    """One byte every 50 ms: a body that would take ~10 s gets 408 (or, when the server
    closes with an unread byte pending, a reset) long before it is complete."""
    body = completion(3, stream=False).ljust(200)
    with connect(srv) as sock:
        sock.sendall(post_head("/v1/completions", len(body)))
        sent = 0
        while sent < len(body) and not select.select([sock], [], [], 0.05)[0]:
            try:
                sock.sendall(body[sent:sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
        assert sent < len(body), "the server waited for the whole trickle"
        raw = read_to_close(sock)
    if raw:
        assert split_response(raw)[0] == 408, raw
    assert_healthy(srv)


# ----- header and request line limits -----------------------------------------------------
LIMITED = {  # each past the fixture's limits (1024 bytes, 16 headers), within aiohttp's caps
    "request-line": (f"GET /v1/models?pad={'a' * 2000} HTTP/1.1\r\nHost: t\r\n\r\n",
                     414, "uri_too_long", "the request line is 2028 bytes"),
    "header-field": (f"GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Big: {'a' * 2000}\r\n\r\n",
                     431, "request_header_fields_too_large", "header field 'X-Big' is 2005 bytes"),
    "header-count": ("GET /v1/models HTTP/1.1\r\nHost: t\r\n"
                     + "".join(f"X-H{i}: v\r\n" for i in range(20)) + "\r\n",
                     431, "request_header_fields_too_large", "the request has 21 header fields"),
}
PAST_PARSER_CAPS = {  # past aiohttp's own hard caps (64 KiB, twice the count): its plain 400
    "request-line": f"GET /health?pad={'a' * (70 << 10)} HTTP/1.1\r\nHost: t\r\n\r\n",
    "header-field": f"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: {'a' * (70 << 10)}\r\n\r\n",
    "header-count": ("GET /health HTTP/1.1\r\nHost: t\r\n"
                     + "".join(f"X-H{i}: v\r\n" for i in range(40)) + "\r\n"),
}


def send_head(srv: ServerThread, head: str) -> tuple[int, dict[str, str], bytes]:
    """Send one request head on a new connection; the answer, read until the server closes."""
    with connect(srv) as sock:
        sock.sendall(head.encode())
        return split_response(read_to_close(sock))


@pytest.mark.parametrize("case", sorted(LIMITED))
def test_oversized_heads_get_an_error_object_and_the_connection_closes(srv, case):
    head, status, code, message = LIMITED[case]
    got, headers, body = send_head(srv, head)  # returns: the server closed the connection
    assert got == status, body
    assert headers["content-type"].startswith("application/json")
    assert headers.get("connection", "").lower() == "close"
    err = json.loads(body)["error"]
    assert err == {"message": err["message"], "type": "invalid_request_error", "param": None,
                   "code": code}
    assert message in err["message"]
    _, _, text = request(f"{srv.url}/metrics")
    assert f'hermes_request_errors_total{{code="{code}"}} 1.0'.encode() in text
    assert_healthy(srv)  # a new connection is served as ever


def test_oversized_head_is_refused_before_authentication():
    """With API keys, a request without one but with too many headers gets 431, not 401."""
    keyed = fake_server(api_keys={"k1": "t1"}, max_headers=16)
    try:
        status, _, body = send_head(keyed, LIMITED["header-count"][0])
        assert status == 431 and json.loads(body)["error"]["code"] == \
            "request_header_fields_too_large"
    finally:
        keyed.stop()


def test_header_value_never_appears_in_the_message(srv):
    secret = "s3cr3t" * 300
    status, _, body = send_head(srv, f"GET /health HTTP/1.1\r\nHost: t\r\nCookie: {secret}"
                                     "\r\n\r\n")
    assert status == 431 and b"s3cr3t" not in body and b"'Cookie'" in body


@pytest.mark.parametrize("case", sorted(PAST_PARSER_CAPS))
def test_heads_past_the_parser_caps_get_aiohttps_400(srv, case):
    status, headers, _ = send_head(srv, PAST_PARSER_CAPS[case])
    assert status == 400  # aiohttp's parser answers, in plain text, before any middleware
    assert headers["content-type"].startswith("text/plain")
    assert_healthy(srv)


def test_headers_within_the_limits_pass(srv):
    head = ("GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
            f"X-Big: {'a' * 900}\r\n" + "".join(f"X-H{i}: v\r\n" for i in range(13)) + "\r\n")
    assert send_head(srv, head)[0] == 200  # 16 fields, the largest 905 bytes


def test_parser_caps_are_above_the_limits():
    assert parser_limits(ServerConfig()) == {"max_line_size": 64 << 10,
                                             "max_field_size": 64 << 10, "max_headers": 256}
    big = ServerConfig(max_request_line_bytes=1 << 20, max_header_bytes=32 << 10,
                       max_headers=1000)
    assert parser_limits(big) == {"max_line_size": 4 << 20, "max_field_size": 128 << 10,
                                  "max_headers": 2000}


# ----- the write clock and the pull probe (respond.py) -----------------------------------
async def test_write_clock_adds_up_the_waits_until_caught_up():
    """Margins of 0.2 s or more; a late wake-up only makes a wait longer."""
    clock = WriteClock(1.0)
    for _ in range(4):  # 0.6 s in all: within the limit
        await clock.write(asyncio.sleep(0.15))
    with pytest.raises(ClientStoppedReading, match="client stopped reading for 1 s"):
        await clock.write(asyncio.sleep(0.6))  # does not fit in what is left (0.4 s)
    clock = WriteClock(1.0)
    for _ in range(4):
        await clock.write(asyncio.sleep(0.15))
    clock.caught_up()  # the client took everything: a fresh second
    await clock.write(asyncio.sleep(0.6))


async def test_pull_tells_whether_the_next_chunk_had_to_wait():
    queue: asyncio.Queue[int] = asyncio.Queue()
    closed = []

    async def chunks():
        try:
            while True:
                yield await queue.get()
        finally:
            closed.append(True)

    it = aiter(chunks())
    queue.put_nowait(1)
    queue.put_nowait(2)
    for want in (1, 2):  # queued already: a backlog, no wait
        pull = Pull(anext(it))
        assert await pull == want and not pull.waited
    pull = Pull(anext(it))
    task = asyncio.ensure_future(pull)
    await asyncio.sleep(0.01)
    queue.put_nowait(3)
    assert await task == 3 and pull.waited  # it waited for the engine: the client kept up
    task = asyncio.ensure_future(Pull(anext(it)))
    await asyncio.sleep(0.01)
    task.cancel()  # cancellation goes through to the generator
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed == [True]


# ----- config -----------------------------------------------------------------------------
def test_slow_client_config_validation():
    cfg = ServerConfig()
    assert (cfg.write_timeout_s, cfg.body_read_timeout_s) == (30.0, 30.0)
    assert (cfg.max_request_line_bytes, cfg.max_header_bytes, cfg.max_headers) == (8190, 8190,
                                                                                 128)
    for bad in ({"write_timeout_s": 0}, {"write_timeout_s": -1}, {"body_read_timeout_s": 0},
                {"body_read_timeout_s": "1"}, {"max_header_bytes": 10},
                {"max_request_line_bytes": 1 << 30}, {"max_headers": 0},
                {"max_headers": 1.5}, {"write_timeout_s": True}):
        with pytest.raises(ConfigError):
            from_dict({"server": bad})
