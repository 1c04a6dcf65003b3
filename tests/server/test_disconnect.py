"""A client that goes away aborts its request at once, streaming or not: afterwards nothing is
running or waiting, no KV block is pinned or private, and the cache is consistent."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest

from tests.server.helpers import engine_idle

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
LONG = {"max_tokens": 4000, "temperature": 0, "ignore_eos": True}  # minutes on a CPU
IDLE = {"requests": 0, "running": 0, "waiting": 0, "pinned": 0, "private": 0}


def in_flight(server) -> int:
    return server.call(lambda: server.engine.load().requests)


def wait_idle(server, within_s: float = 10.0) -> float:
    """Seconds until the engine is idle; fails after ``within_s`` (the long request would
    still be generating)."""
    t0 = time.monotonic()
    while True:
        state = server.call(lambda: engine_idle(server.engine))
        if state == IDLE:
            server.call(server.engine.check_integrity)
            return time.monotonic() - t0
        assert time.monotonic() - t0 < within_s, f"not aborted: {state}"
        time.sleep(0.05)


def wait_in_flight(server, within_s: float = 30.0) -> None:
    t0 = time.monotonic()
    while in_flight(server) == 0:
        assert time.monotonic() - t0 < within_s, "the request never started"
        time.sleep(0.02)


async def test_streaming_disconnect_aborts(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to a million."}],
            "stream": True, **LONG}
    async with aiohttp.ClientSession() as http:
        r = await http.post(f"{server.url}/v1/chat/completions", json=body)
        assert r.status == 200
        seen = b""
        while b'"content":"' not in seen.replace(b'"content":""', b""):
            seen += await r.content.readany()
        assert await asyncio.to_thread(in_flight, server) == 1
        r.close()  # drop the connection mid-stream
    await asyncio.to_thread(wait_idle, server)


async def test_non_streaming_disconnect_aborts(server):
    body = {"model": MODEL, "prompt": "Once upon a time", **LONG}
    async with aiohttp.ClientSession() as http:
        task = asyncio.create_task(http.post(f"{server.url}/v1/completions", json=body))
        await asyncio.to_thread(wait_in_flight, server)
        task.cancel()  # the client gives up: its connection closes
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.to_thread(wait_idle, server)


def test_openai_client_timeout_and_early_break_abort(server):
    with openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0,
                       timeout=1.5) as c, pytest.raises(openai.APITimeoutError):
        c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4000,
                             temperature=0, extra_body={"ignore_eos": True})
    wait_idle(server)
    with openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
        stream = c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Count to a million."}],
            max_tokens=4000, temperature=0, stream=True, extra_body={"ignore_eos": True})
        for i, _chunk in enumerate(stream):
            if i == 3:
                break
        stream.close()
    wait_idle(server)
    # and the server still serves
    with openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
        assert c.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices
