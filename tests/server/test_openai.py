"""End to end with the official ``openai`` client (sync and async) on the real default model:
streamed text equals non-streamed text for greedy, usage and cached tokens, ``n``, ``stop``,
logprobs, several prompts, echo, /v1/models, /tokenize, /metrics."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import openai
import pytest

from tests.server.helpers import engine_idle, request_json

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"
MODEL = "SmolLM2-135M-Instruct"
METRIC_NAMES = (
    "hermes_num_requests_running", "hermes_num_requests_waiting", "hermes_kv_blocks_total",
    "hermes_kv_blocks_free", "hermes_kv_blocks_cached", "hermes_kv_blocks_referenced",
    "hermes_kv_blocks_pinned",
    "hermes_prefix_cache_queries_total", "hermes_prefix_cache_hits_total",
    "hermes_prefix_cache_matched_tokens_bucket", "hermes_assembly_cache_queries_total",
    "hermes_assembly_cache_hits_total", "hermes_assembly_cache_partial_hits_total",
    "hermes_evicted_blocks_total", "hermes_pruned_nodes_total", "hermes_preemptions_total",
    "hermes_prompt_tokens_total", "hermes_generation_tokens_total",
    "hermes_time_to_first_token_seconds_bucket", "hermes_inter_token_latency_seconds_bucket",
    "hermes_e2e_request_latency_seconds_bucket",
)


def msgs(text: str = QUESTION) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                       timeout=120) as c:
        yield c


@pytest.fixture
async def aclient(server):
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                                  timeout=120) as c:
        yield c


def test_models_lists_the_served_model(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["max_model_len"] == 182 * 32  # capped by the KV pool
    assert server.state.model_name == MODEL


def test_chat_sync_stream_equals_non_stream(client):
    full = client.chat.completions.create(model=MODEL, messages=msgs(), max_tokens=16,
                                          temperature=0)
    assert full.object == "chat.completion" and full.id.startswith("chatcmpl-")
    choice = full.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert "Paris" in choice.message.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs(), max_tokens=16,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == choice.message.content
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)
    assert full.usage.prompt_tokens > 0
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens


async def test_chat_async_usage_and_cached_tokens(aclient):
    salt = uuid.uuid4().hex  # a namespace of its own: nothing cached yet
    kwargs = dict(model=MODEL, messages=msgs(), max_tokens=8, temperature=0,
                  extra_body={"cache_salt": salt})
    first = await aclient.chat.completions.create(**kwargs)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    stream = await aclient.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    assert last.usage.prompt_tokens == first.usage.prompt_tokens
    assert last.usage.completion_tokens == first.usage.completion_tokens
    cached = last.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < first.usage.prompt_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == \
        first.choices[0].message.content


def test_completions_sync_stream_equals_non_stream(client):
    prompt = "The capital of France is"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0)
    assert full.object == "text_completion" and full.id.startswith("cmpl-")
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 10
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=10,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_completions_async_usage(aclient):
    prompt = f"Tell me a story about {uuid.uuid4().hex}."
    extra = {"ignore_eos": True}  # a vLLM extra: exactly max_tokens tokens
    full = await aclient.completions.create(model=MODEL, prompt=prompt, max_tokens=6,
                                            temperature=0, extra_body=extra)
    stream = await aclient.completions.create(model=MODEL, prompt=prompt, max_tokens=6,
                                              temperature=0, stream=True, extra_body=extra,
                                              stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_n_choices(client):
    kwargs = dict(model=MODEL, messages=msgs("Name a color."), n=2, max_tokens=4,
                  temperature=1.0, seed=7)
    res = client.chat.completions.create(**kwargs)
    assert sorted(c.index for c in res.choices) == [0, 1]
    assert all(c.message.content and c.finish_reason in ("stop", "length")
               for c in res.choices)
    texts = {0: "", 1: ""}
    finished = set()
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for ch in chunk.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finished.add(ch.index)
    assert finished == {0, 1}
    assert texts == {c.index: c.message.content for c in res.choices}  # same seeds


def test_stop_string(client):
    full = client.chat.completions.create(model=MODEL, messages=msgs(), max_tokens=16,
                                          temperature=0).choices[0].message.content
    assert " Paris" in full
    cut = full[:full.index(" Paris")]
    res = client.chat.completions.create(model=MODEL, messages=msgs(), max_tokens=16,
                                         temperature=0, stop=[" Paris"])
    assert res.choices[0].message.content == cut and res.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs(), max_tokens=16,
                                                 temperature=0, stop=" Paris", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == cut


def test_chat_logprobs(client):
    res = client.chat.completions.create(model=MODEL, messages=msgs(), max_tokens=5,
                                         temperature=0, logprobs=True, top_logprobs=2)
    content = res.choices[0].logprobs.content
    assert len(content) == res.usage.completion_tokens == 5
    assert "".join(t.token for t in content) == res.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and bytes(t.bytes).decode() == t.token
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token  # greedy


def test_completion_logprobs_batch_and_echo(client, server):
    res = client.completions.create(model=MODEL, prompt=["One, two,", "Red, green,"],
                                    max_tokens=4, temperature=0, logprobs=2)
    assert [c.index for c in res.choices] == [0, 1]
    for c in res.choices:
        lp = c.logprobs
        assert "".join(lp.tokens) == c.text and len(lp.token_logprobs) == 4
        assert lp.text_offset[0] == 0 and all(len(d) <= 2 for d in lp.top_logprobs)
    assert res.usage.completion_tokens == 8
    ids = request_json(f"{server.url}/tokenize", {"prompt": "One, two,"})[2]["tokens"]
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == res.choices[0].text
    echo = client.completions.create(model=MODEL, prompt="One, two,", max_tokens=4,
                                     temperature=0, echo=True)
    assert echo.choices[0].text == "One, two," + res.choices[0].text


async def test_tokenize_matches_generation(server, client):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/tokenize",
                             json={"model": MODEL, "messages": msgs()}) as r:
            assert r.status == 200
            tok = await r.json()
        async with http.post(f"{server.url}/tokenize", json={"prompt": "Hello world"}) as r:
            plain = await r.json()
    # the test pool (256 MiB: 182 blocks of 32 tokens) caps the model's 8192 to what it holds
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 182 * 32
    res = client.chat.completions.create(model=MODEL, messages=msgs(), max_tokens=1)
    assert res.usage.prompt_tokens == tok["count"]
    assert plain["count"] == 2


async def test_metrics_names(server, client):
    client.chat.completions.create(model=MODEL, messages=msgs(), max_tokens=2)
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/metrics") as r:
        assert r.status == 200 and r.content_type == "text/plain"
        text = await r.text()
    names = METRIC_NAMES
    lines = text.splitlines()
    for name in names:
        assert any(line.startswith(name) for line in lines), name
    assert 'hermes_assembly_cache_hits_total{namespace="default"}' in text
    assert "# TYPE hermes_request_errors_total counter" in text  # samples: see test_errors


async def test_concurrent_mixed_requests_leave_the_engine_idle(aclient, server):
    async def chat(i: int, stream: bool) -> int:
        kwargs = dict(model=MODEL, messages=msgs(f"Say the number {i}."), max_tokens=6,
                      temperature=0.7, seed=i)
        if not stream:
            return (await aclient.chat.completions.create(**kwargs)).usage.completion_tokens
        chunks = [c async for c in await aclient.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True})]
        return chunks[-1].usage.completion_tokens

    async def complete(i: int) -> int:
        res = await aclient.completions.create(model=MODEL, prompt=f"{i} times {i} is",
                                               max_tokens=5, temperature=0, n=2)
        return res.usage.completion_tokens

    counts = await asyncio.gather(*[chat(i, i % 2 == 0) for i in range(6)],
                                  *[complete(i) for i in range(3)])
    assert all(c >= 1 for c in counts)
    state = await asyncio.to_thread(server.call, lambda: engine_idle(server.engine))
    assert state == {"requests": 0, "running": 0, "waiting": 0, "pinned": 0, "private": 0}
