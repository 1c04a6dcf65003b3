"""Structured outputs end to end: the official ``openai`` client against the real default model,
every answer checked by an independent oracle (``jsonschema``, ``re``, pydantic)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server.helpers import engine_idle, request_json
from tests.server.schemagen import schemas

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


def _client(server: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                              timeout=300)


async def _json_answer(client: openai.AsyncOpenAI, schema: dict[str, Any], temperature: float,
                       seed: int) -> tuple[str, str]:
    r = await client.chat.completions.create(
        model=MODEL, temperature=temperature, seed=seed, max_tokens=400,
        messages=[{"role": "user", "content": "Fill in this form as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": f"form{seed}", "schema": schema,
                                         "strict": True}})
    return r.choices[0].message.content or "", r.choices[0].finish_reason


def test_forty_generated_schemas_validate_at_temperature_0_and_1(server: Any) -> None:
    cases = [(s, t, i) for i, s in enumerate(schemas(40)) for t in (0.0, 1.0)]

    async def run() -> list[tuple[str, str]]:
        async with _client(server) as client:
            return await asyncio.gather(*[_json_answer(client, s, t, i) for s, t, i in cases])

    answers = asyncio.run(run())
    for (schema, temperature, i), (text, reason) in zip(cases, answers, strict=True):
        assert reason == "stop", (i, temperature, text)
        jsonschema.validate(json.loads(text), schema)  # raises with the path on failure
    assert server.call(lambda: engine_idle(server.engine)) == {
        "requests": 0, "running": 0, "waiting": 0, "pinned": 0, "private": 0}


def test_json_object_regex_and_choice(server: Any) -> None:
    async def run() -> None:
        async with _client(server) as client:
            for temperature in (0.0, 1.0):
                for ask in ("Give a person's name and age as a JSON object.",
                            "Return a JSON object with a city and its country.",
                            "Answer in JSON: what colour is the sky?"):
                    r = await client.chat.completions.create(
                        model=MODEL, temperature=temperature, max_tokens=400, seed=7,
                        messages=[{"role": "user", "content": ask}],
                        response_format={"type": "json_object"})
                    assert isinstance(json.loads(r.choices[0].message.content), dict), ask
                r = await client.completions.create(
                    model=MODEL, prompt="A phone number:", temperature=temperature,
                    max_tokens=20, extra_body={"guided_regex": r"\+?[0-9]{3}-[0-9]{4}"})
                assert re.fullmatch(r"\+?[0-9]{3}-[0-9]{4}", r.choices[0].text)
                r = await client.chat.completions.create(
                    model=MODEL, temperature=temperature, max_tokens=10, n=3,
                    messages=[{"role": "user", "content": "Is the sky green?"}],
                    extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}})
                assert all(c.message.content in ("yes", "no", "maybe") for c in r.choices)

    asyncio.run(run())


def test_streamed_json_schema_concatenates_to_a_valid_document(server: Any) -> None:
    schema = schemas(3, seed=99)[2]

    async def run() -> str:
        async with _client(server) as client:
            stream = await client.chat.completions.create(
                model=MODEL, temperature=1.0, max_tokens=400, stream=True,
                messages=[{"role": "user", "content": "JSON, please."}],
                extra_body={"guided_json": schema})
            return "".join([c.choices[0].delta.content or "" async for c in stream
                            if c.choices])

    jsonschema.validate(json.loads(asyncio.run(run())), schema)


class Person(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=120)
    languages: list[str] = Field(min_length=1, max_length=3)


def test_openai_parse_with_a_pydantic_model(server: Any) -> None:
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client:
        r = client.chat.completions.parse(
            model=MODEL, temperature=0, max_tokens=200, response_format=Person,
            messages=[{"role": "user", "content": "Invent a programmer."}])
    person = r.choices[0].message.parsed
    assert isinstance(person, Person)
    Person.model_validate_json(r.choices[0].message.content)


def test_max_tokens_before_the_grammar_completes_is_length(server: Any) -> None:
    status, _, body = request_json(f"{server.base_url}/chat/completions", {
        "model": MODEL, "max_tokens": 3, "temperature": 0,
        "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "s", "schema": {"type": "object", "properties": {
                "text": {"type": "string", "minLength": 40}}, "required": ["text"]}}}})
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert server.call(lambda: engine_idle(server.engine))["requests"] == 0


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                "schema": {"type": "nope"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"guided_regex": "a(b"}, "guided_regex"),
    ({"guided_grammar": "root ::= foo("}, "guided_grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_*"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"allowed_token_ids": [99999999]}, "allowed_token_ids"),
])
def test_invalid_constraints_are_400_naming_the_parameter(server: Any, extra: dict[str, Any],
                                                           param: str) -> None:
    status, _, body = request_json(f"{server.base_url}/chat/completions", {
        "model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
        **extra})
    assert status == 400, body
    assert body["error"]["param"] == param and body["error"]["message"]
    status, _, _ = request_json(f"{server.base_url}/chat/completions", {
        "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
    assert status == 200


def test_grammar_cache_counts_hits_in_metrics_and_stats(server: Any) -> None:
    schema = {"type": "object", "properties": {"unique_cache_probe": {"type": "boolean"}},
              "required": ["unique_cache_probe"]}

    def stats() -> dict[str, Any]:
        return request_json(f"{server.base_url.removesuffix('/v1')}/cache/stats")[2]["grammar"]

    before = stats()

    async def run() -> None:
        async with _client(server) as client:
            await asyncio.gather(*[client.chat.completions.create(
                model=MODEL, max_tokens=30, temperature=0,
                messages=[{"role": "user", "content": "x"}],
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "p", "schema": schema}})
                for _ in range(3)])

    asyncio.run(run())
    after = stats()
    assert after["misses"] - before["misses"] == 1  # three requests, one compile
    assert after["hits"] - before["hits"] == 2
    status, _, metrics = 0, None, None
    import urllib.request
    with urllib.request.urlopen(f"{server.base_url.removesuffix('/v1')}/metrics") as r:
        metrics = r.read().decode()
    hits = re.search(r"^hermes_grammar_cache_hits_total (\S+)$", metrics, re.M)
    assert hits is not None and float(hits.group(1)) == after["hits"]
    del status


def test_logit_bias_allowed_token_ids_and_bad_words(server: Any) -> None:
    tok = server.engine.tokenizer
    comma = tok.encode(",", add_special_tokens=False)[0]
    base = {"model": MODEL, "max_tokens": 6, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}]}
    _, _, body = request_json(f"{server.base_url}/chat/completions",
                              {**base, "logit_bias": {str(comma): 100}})
    assert body["choices"][0]["message"]["content"] == "," * 6
    allowed = tok.encode(" yes no", add_special_tokens=False)
    _, _, body = request_json(f"{server.base_url}/chat/completions",
                              {**base, "allowed_token_ids": allowed, "logprobs": True})
    ids = [tok.convert_tokens_to_ids(t["token"]) if False else None
           for t in body["choices"][0]["logprobs"]["content"]]
    del ids
    text = body["choices"][0]["message"]["content"]
    assert set(tok.encode(text, add_special_tokens=False)) <= set(allowed)
    _, _, plain = request_json(f"{server.base_url}/chat/completions", {**base, "max_tokens": 12})
    word = plain["choices"][0]["message"]["content"].split()[0].strip(",.!")
    _, _, body = request_json(f"{server.base_url}/chat/completions",
                              {**base, "max_tokens": 12, "bad_words": [word]})
    assert word not in body["choices"][0]["message"]["content"]


def test_aborted_constrained_streams_and_n_leave_nothing_behind(server: Any) -> None:
    story = {"type": "string", "minLength": 50, "maxLength": 80}
    schema = {"type": "object", "properties": {"story": story}, "required": ["story"]}

    async def run() -> None:
        async with _client(server) as client:
            for _ in range(3):  # leave each stream after a few chunks
                stream = await client.chat.completions.create(
                    model=MODEL, max_tokens=100, n=2, stream=True, temperature=1.0,
                    messages=[{"role": "user", "content": "A long story, as JSON."}],
                    extra_body={"guided_json": schema})
                seen = 0
                async for _chunk in stream:
                    seen += 1
                    if seen > 5:
                        break
                await stream.close()
            r = await client.chat.completions.create(
                model=MODEL, max_tokens=100, n=3, temperature=1.0,
                messages=[{"role": "user", "content": "x"}],
                extra_body={"guided_json": schema})
            for choice in r.choices:
                assert choice.finish_reason in ("stop", "length")
                if choice.finish_reason == "stop":
                    jsonschema.validate(json.loads(choice.message.content), schema)

    asyncio.run(run())

    async def settled() -> dict[str, int]:
        for _ in range(100):
            idle = engine_idle(server.engine)
            if not any(idle.values()):
                break
            await asyncio.sleep(0.05)
        server.engine.check_integrity()
        return idle

    assert server.run(settled()) == {"requests": 0, "running": 0, "waiting": 0, "pinned": 0,
                                     "private": 0}


def test_a_batch_mixing_logprobs_and_plain_requests(server: Any) -> None:
    """Regression: rows without logprobs in a step where another row asks for them."""

    async def run() -> list[Any]:
        async with _client(server) as client:
            return await asyncio.gather(*[client.chat.completions.create(
                model=MODEL, max_tokens=12, temperature=0, logprobs=i % 2 == 0,
                messages=[{"role": "user", "content": f"Count to {i + 3}."}])
                for i in range(6)])

    for i, r in enumerate(asyncio.run(run())):
        assert r.choices[0].finish_reason in ("stop", "length")
        assert (r.choices[0].logprobs is not None) == (i % 2 == 0)


def test_constraints_that_contradict_the_grammar_are_a_400(server: Any) -> None:
    """``allowed_token_ids`` leaving no token a regex allows: the grammar rejects the sampled
    token, which is the request's doing: a 400 naming it (not a 500), and nothing held."""
    tok = server.engine.tokenizer
    only_b = tok.encode("b", add_special_tokens=False)
    status, _, body = request_json(f"{server.base_url}/completions", {
        "model": MODEL, "prompt": "Letters:", "max_tokens": 4, "temperature": 0,
        "guided_regex": "a+", "allowed_token_ids": only_b})
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "grammar_rejected"
    assert set(server.call(lambda: engine_idle(server.engine)).values()) == {0}
