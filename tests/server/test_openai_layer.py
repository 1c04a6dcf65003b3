"""The OpenAI layer driven directly, with no web framework at all: what a second front end (an
ASGI app) would do. An engine over the torch-free FakeRunner; the services' responses are
checked as a front end writes them (status, headers, bytes), and nothing here imports aiohttp
or ``hermes_async.server``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from hermes_async.config import CacheConfig, EngineConfig, SchedulerConfig, ServerConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.openai import (
    ROUTES,
    APIError,
    CacheScope,
    Caller,
    JSONResponse,
    RawResponse,
    RequestContext,
    ServiceState,
    StreamingResponse,
    answer_error,
    cache_stats,
    chat_completions,
    completions,
    health,
    metrics,
    resolve_caller,
)
from tests.engine.fake_runner import EOS, FakeRunner, fake_output_text, reference_tokens

PROMPT = [5, 6, 7, 8, 9]


def body(**fields: Any) -> bytes:
    return msgspec.json.encode({"model": "fake", "prompt": PROMPT, "max_tokens": 8, **fields})


def fake_text(prompt: list[int], n: int) -> str:
    return "".join(f"<{t}>" for t in reference_tokens(prompt, n))


@pytest.fixture
async def state() -> AsyncIterator[ServiceState]:
    cfg = EngineConfig(cache=CacheConfig(block_size=4),
                       scheduler=SchedulerConfig(max_waiting_tokens=8),
                       server=ServerConfig(served_model_name="fake",
                                           api_keys={"sk-a": "team-a"}, retry_after_s=3))
    engine = AsyncEngine(cfg, runner=FakeRunner(), tokenizer=object(), eos_token_ids=[EOS],
                         output_text=fake_output_text)
    st = ServiceState.of(cfg, engine)
    st.start()
    await st.wait_until_ready()
    yield st
    await st.stop()
    assert not st.engine.is_running  # stopped: its integrity check ran


def ctx_of(state: ServiceState, tenant: str = "team-a") -> RequestContext:
    return RequestContext(state, Caller(tenant))


def assert_idle(state: ServiceState) -> None:
    load = state.engine.load()
    assert (load.requests, load.running, load.waiting) == (0, 0, 0)
    assert load.blocks.referenced == 0 and load.blocks.private == 0
    state.engine.check_integrity()


def error_of(res: object, status: int) -> dict[str, Any]:
    assert isinstance(res, JSONResponse) and res.status == status, res
    assert res.content_type == "application/json"
    assert set(res.body) == {"error"}
    assert set(res.body["error"]) == {"message", "type", "param", "code"}
    assert msgspec.json.decode(res.payload()) == res.body
    return res.body["error"]


async def read_stream(res: object) -> bytes:
    assert isinstance(res, StreamingResponse) and res.status == 200
    assert res.headers["Content-Type"].startswith("text/event-stream")
    raw = b""
    try:
        async for chunk in res:
            raw += chunk
    finally:
        await res.aclose()
    return raw


def test_the_layer_imports_no_web_framework():
    code = ("import sys, hermes_async.openai; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp' "
            "or m.startswith('hermes_async.server')); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert {(r.method, r.path) for r in ROUTES} >= {("POST", "/v1/chat/completions"),
                                                    ("POST", "/v1/completions"),
                                                    ("GET", "/health"), ("GET", "/metrics")}


async def test_completion_non_streaming(state):
    res = await completions(ctx_of(state), body())
    assert isinstance(res, JSONResponse) and res.status == 200
    doc = msgspec.json.decode(res.payload())
    assert doc["object"] == "text_completion" and doc["id"].startswith("cmpl-")
    assert doc["model"] == "fake"
    (choice,) = doc["choices"]
    assert choice == {"index": 0, "text": fake_text(PROMPT, 8), "logprobs": None,
                      "finish_reason": "length"}
    assert doc["usage"] == {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13,
                            "prompt_tokens_details": {"cached_tokens": 0}}
    assert_idle(state)


async def test_completion_streamed_ends_with_done(state):
    res = await completions(ctx_of(state), body(stream=True,
                                                stream_options={"include_usage": True}))
    raw = await read_stream(res)
    assert raw.endswith(b"data: [DONE]\n\n")
    events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    chunks = [msgspec.json.decode(e[6:]) for e in events]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert len({c["id"] for c in chunks}) == 1
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == \
        fake_text(PROMPT, 8)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    assert_idle(state)


async def test_closing_a_stream_early_aborts_it(state):
    res = await completions(ctx_of(state), body(stream=True, max_tokens=400))
    assert isinstance(res, StreamingResponse)
    seen = 0
    async for _chunk in res:  # a client that goes away after two chunks
        seen += 1
        if seen == 2:
            break
    assert state.engine.load().requests == 1
    await res.aclose()
    await res.aclose()  # idempotent
    assert_idle(state)


async def test_error_objects(state):
    ctx = ctx_of(state)
    err = error_of(await completions(ctx, b"{bad"), 400)
    assert err["code"] == "invalid_json" and err["type"] == "invalid_request_error"
    err = error_of(await completions(ctx, body(prompt=[])), 400)
    assert (err["code"], err["param"]) == ("invalid_value", "prompt")
    err = error_of(await completions(ctx, body(max_tokens="x")), 400)
    assert (err["code"], err["param"]) == ("invalid_value", "max_tokens")
    err = error_of(await completions(ctx, body(model="gpt-9")), 404)
    assert err["code"] == "model_not_found"
    chat = msgspec.json.encode({"messages": [{"role": "user", "content": "hi"}]})
    err = error_of(await chat_completions(ctx, chat), 400)  # the engine's InvalidParameter
    assert (err["code"], err["param"]) == ("no_chat_template", "messages")
    # the front end's own failures (here: authentication) go through the same mapping
    with pytest.raises(APIError) as e:
        resolve_caller(state.auth, "/v1/completions", "Bearer wrong")
    res = answer_error(state, e.value)
    assert error_of(res, 401)["code"] == "invalid_api_key"
    assert res.headers["WWW-Authenticate"].startswith("Bearer")
    assert resolve_caller(state.auth, "/v1/completions", "Bearer sk-a") == Caller("team-a")
    text = (await metrics(ctx, {})).payload().decode()
    for code in ("invalid_json", "invalid_value", "model_not_found", "no_chat_template",
                 "invalid_api_key"):
        assert f'hermes_request_errors_total{{code="{code}"}}' in text, code
    assert_idle(state)


async def test_429_when_the_queue_is_full(state):
    """10 prompt tokens against ``max_waiting_tokens = 8``: refused at admission."""
    res = await completions(ctx_of(state), body(prompt=list(range(3, 13))))
    err = error_of(res, 429)
    assert err["code"] == "queue_full" and err["type"] == "rate_limit_error"
    assert res.headers["Retry-After"] == "3"  # server.retry_after_s
    assert_idle(state)


async def test_health_metrics_and_cache_stats(state):
    ctx = ctx_of(state)
    res = await health(ctx, {})
    assert isinstance(res, JSONResponse) and (res.status, res.body) == (200, {"status": "ok"})
    await completions(ctx, body())
    res = await metrics(ctx, {})
    assert isinstance(res, RawResponse) and res.content_type.startswith("text/plain")
    assert b"hermes_kv_blocks_referenced" in res.payload()
    admin = RequestContext(state, Caller(scope=CacheScope(None)))
    res = await cache_stats(admin, {"namespace": "team-a"})
    assert isinstance(res, JSONResponse) and res.status == 200, res
    b = res.body["blocks"]
    assert b["free"] + b["cached"] + b["referenced"] + b["private"] == b["total"]
    assert set(res.body["namespaces"]) == {"team-a"}
    tenant = RequestContext(state, Caller("team-b", CacheScope("team-b")))
    err = error_of(await cache_stats(tenant, {"namespace": "team-a"}), 403)
    assert err["code"] == "namespace_forbidden"
    await state.engine.stop()
    err = error_of(await health(ctx, {}), 503)
    assert err["code"] == "shutting_down"
