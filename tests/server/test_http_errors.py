"""Every error status with OpenAI's error object, API keys and tenant isolation, raw SSE
framing with keep-alive comments; after each error the server is healthy. One real server with
API keys, a 16 KiB body limit, a 256-token waiting queue and a 1024-token context."""

from __future__ import annotations

import re
import uuid

import aiohttp
import msgspec
import openai
import pytest

from tests.server.helpers import ServerThread, real_config, request, request_json

pytestmark = pytest.mark.slow

KEYS = {"sk-a": "tenant-a", "sk-b": "tenant-b", "sk-iso-1": "iso-1", "sk-iso-2": "iso-2"}
A = {"Authorization": "Bearer sk-a"}
MODEL = "SmolLM2-135M-Instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}


@pytest.fixture(scope="module")
def srv(default_model_dir):
    cfg = real_config(default_model_dir, max_model_len=1024,
                      server={"api_keys": KEYS, "max_body_bytes": 16384,
                              "keepalive_interval_s": 0.005, "retry_after_s": 3},
                      scheduler={"max_waiting_tokens": 256})
    s = ServerThread(cfg).start()
    yield s
    s.stop()


def post(srv, path, body=None, headers=A, **kw):
    return request_json(f"{srv.url}{path}", body, headers=headers, **kw)


def assert_error(result, status, code, param=None):
    got_status, _, body = result
    assert got_status == status, body
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code and body["error"]["param"] == param, body
    assert body["error"]["message"]
    return body["error"]


def assert_healthy(srv):
    assert request(f"{srv.url}/health")[0] == 200
    status, _, body = post(srv, "/v1/chat/completions", CHAT)
    assert status == 200 and body["choices"][0]["message"]["content"] is not None


def client(srv, key="sk-a"):
    return openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0, timeout=120)


def test_401_missing_or_wrong_key(srv):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic sk-a"},
                    {"Authorization": "Bearer"}):
        err = assert_error(post(srv, "/v1/chat/completions", CHAT, headers=headers), 401,
                           "invalid_api_key")
        assert err["type"] == "invalid_request_error"
    assert_error(post(srv, "/v1/models", headers={}), 401, "invalid_api_key")
    assert_error(post(srv, "/tokenize", {"prompt": "x"}, headers={}), 401, "invalid_api_key")
    with pytest.raises(openai.AuthenticationError), client(srv, "sk-wrong") as c:
        c.models.list()
    assert request(f"{srv.url}/metrics")[0] == 200  # probes need no key
    with client(srv) as c:
        assert [m.id for m in c.models.list().data] == [MODEL]
    assert_healthy(srv)


def test_400_bad_json_and_schema_name_the_field(srv):
    path = "/v1/chat/completions"
    for raw in (b"{bad", b"", b'{"messages": [}'):
        assert_error(request_json(f"{srv.url}{path}", raw=raw, headers=A), 400, "invalid_json")
    assert_error(request_json(f"{srv.url}{path}", raw=b"[1]", headers=A), 400,
                 "invalid_request")
    cases = [
        ({**CHAT, "max_tokens": "x"}, "max_tokens", "invalid_value"),
        ({"model": MODEL}, "messages", "invalid_value"),
        ({**CHAT, "messages": [{"content": "hi"}]}, "messages[0].role", "invalid_message"),
        ({**CHAT, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage",
         "invalid_value"),
        ({**CHAT, "top_p": 0}, "top_p", "invalid_value"),
        ({**CHAT, "n": 0}, "n", "invalid_value"),
        ({**CHAT, "max_tokens": 0}, "max_tokens", "invalid_value"),
        ({**CHAT, "logit_bias": {"5": 101.0}}, "logit_bias", "invalid_value"),
        ({**CHAT, "response_format": {"type": "yaml"}}, "response_format.type",
         "invalid_value"),
        ({**CHAT, "stream": True, "temperature": -1}, "temperature", "invalid_value"),
    ]
    for body, param, code in cases:
        assert_error(post(srv, path, body), 400, code, param)
    for prompt in ([], [1, "a"], [[]]):
        assert_error(post(srv, "/v1/completions", {"model": MODEL, "prompt": prompt}), 400,
                     "invalid_value", "prompt")
    assert_error(post(srv, "/v1/completions", {"prompt": [10**9]}), 400, "invalid_value",
                 "prompt")
    assert_error(post(srv, "/tokenize", {"model": MODEL}), 400, "invalid_value", "prompt")
    # unknown OpenAI fields are accepted and ignored
    status, _, _ = post(srv, path, {**CHAT, "user": "u1", "store": False, "metadata": {},
                                    "parallel_tool_calls": True, "tool_choice": "none"})
    assert status == 200
    assert_healthy(srv)


def test_400_context_length_exceeded(srv):
    err = assert_error(post(srv, "/v1/chat/completions", {**CHAT, "max_tokens": 2000}), 400,
                       "context_length_exceeded", "messages")
    assert "1024" in err["message"]
    assert_error(post(srv, "/v1/completions", {"prompt": [100] * 1100, "max_tokens": 1}), 400,
                 "context_length_exceeded", "prompt")
    with client(srv) as c, pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="Hello", max_tokens=1024)
    assert e.value.code == "context_length_exceeded"
    assert_healthy(srv)


def test_404_unknown_model_and_route(srv):
    assert_error(post(srv, "/v1/chat/completions", {**CHAT, "model": "gpt-9"}), 404,
                 "model_not_found", "model")
    with client(srv) as c, pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="gpt-9", prompt="Hello", max_tokens=1)
    assert e.value.code == "model_not_found"
    assert_error(request_json(f"{srv.url}/v1/nothing", headers=A), 404, "not_found")
    assert_healthy(srv)


async def test_413_body_too_large(srv):
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 20000}]}
    assert_error(post(srv, "/v1/chat/completions", big), 413, "request_too_large")

    async def chunks():  # no Content-Length: the app's client_max_size bound applies
        for _ in range(20):
            yield b" " * 1000

    async with aiohttp.ClientSession() as http, http.post(
            f"{srv.url}/v1/completions", data=chunks(), headers=A) as r:
        assert r.status == 413
        assert (await r.json())["error"]["code"] == "request_too_large"
    assert_healthy(srv)


def test_429_queue_full_with_retry_after(srv):
    status, headers, body = post(srv, "/v1/completions", {"prompt": [100] * 300,
                                                          "max_tokens": 1})
    assert_error((status, headers, body), 429, "queue_full")
    assert body["error"]["type"] == "rate_limit_error" and headers["Retry-After"] == "3"
    with client(srv) as c, pytest.raises(openai.RateLimitError):
        c.completions.create(model=MODEL, prompt=[100] * 300, max_tokens=1)
    assert_healthy(srv)


def test_error_metrics_by_code(srv):
    post(srv, "/v1/chat/completions", {**CHAT, "model": "nope"})
    post(srv, "/v1/chat/completions", CHAT, headers={})
    text = request(f"{srv.url}/metrics")[2].decode()
    for code in ("model_not_found", "invalid_api_key"):
        assert re.search(rf'hermes_request_errors_total{{code="{code}"}} [1-9]', text), code


def test_tenant_isolation(srv):
    """Same prompt, two keys: the second tenant sees nothing of the first one's cache."""
    body = {**CHAT, "messages": [{"role": "user", "content": "Describe the sea in June."}]}

    def cached(key):
        status, _, res = post(srv, "/v1/chat/completions", body,
                              headers={"Authorization": f"Bearer {key}"})
        assert status == 200
        return res["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("sk-iso-1") == 0
    assert cached("sk-iso-1") > 0
    assert cached("sk-iso-2") == 0
    assert cached("sk-iso-2") > 0


def test_cache_salt_splits_a_tenant(srv):
    body = {"prompt": f"A unique prompt {uuid.uuid4().hex} " * 4, "max_tokens": 1}

    def cached(salt):
        res = post(srv, "/v1/completions", {**body, "cache_salt": salt})[2]
        return res["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("s1") == 0
    assert cached("s1") > 0
    assert cached("s2") == 0
    assert post(srv, "/v1/completions", body)[2]["usage"]["prompt_tokens_details"][
        "cached_tokens"] == 0  # no salt: the tenant's own namespace, still cold


def _events(raw: bytes) -> list[bytes]:
    assert raw.endswith(b"data: [DONE]\n\n")
    parts = raw.split(b"\n\n")
    assert parts[-1] == b""
    return parts[:-1]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_sse_framing_on_raw_bytes(srv, path):
    body = {"model": MODEL, "max_tokens": 6, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if path == "/v1/completions":
        body["prompt"] = "The capital of France is"
    else:
        body["messages"] = [{"role": "user", "content": "What is the capital of France?"}]
    async with aiohttp.ClientSession() as http, http.post(f"{srv.url}{path}", json=body,
                                                          headers=A) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        assert r.headers["Cache-Control"] == "no-cache"
        raw = await r.read()
    events = _events(raw)
    assert b": keep-alive" in events  # 5 ms keep-alive interval: between tokens
    data = [e for e in events if e != b": keep-alive"]
    assert all(e.startswith(b"data: ") and b"\n" not in e for e in data)
    assert data[-1] == b"data: [DONE]"
    chunks = [msgspec.json.decode(e[6:]) for e in data[:-1]]
    kind = "chat.completion.chunk" if "chat" in path else "text_completion"
    assert {c["object"] for c in chunks} == {kind} and len({c["id"] for c in chunks}) == 1
    if "chat" in path:
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    with client(srv) as c:  # the openai client skips the comments
        stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user",
                                           "content": "Hi"}], max_tokens=4, stream=True)
        assert [ch.id for ch in stream]


async def test_streaming_errors_before_the_stream_are_json(srv):
    async with aiohttp.ClientSession() as http, http.post(
            f"{srv.url}/v1/chat/completions", json={**CHAT, "stream": True, "n": 500},
            headers=A) as r:
        assert r.status == 400 and r.content_type == "application/json"
        assert (await r.json())["error"]["param"] == "n"
