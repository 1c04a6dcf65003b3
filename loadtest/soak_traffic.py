"""The soak's traffic (import as ``from soak_traffic import ...``): ``concurrency`` asyncio
clients (aiohttp), each sending one request after another from a weighted mix until a deadline.

Kinds (weights in :data:`MIX`): streamed chat; clients that vanish mid-stream (close the
connection after 1-4 content chunks); non-streamed chat; ``n`` = 2-3 (streamed or not); stop
strings (the answer must end before them); structured outputs (``response_format``
``json_object``: a finished answer must parse); ``/v1/completions`` (streamed or not); bad
requests (invalid JSON, bad parameters, a wrong key: each must get its 4xx with an OpenAI error
object). Requests rotate over the tenants' API keys; every chat request starts with one of its
tenant's shared system prompts, so the prefix cache hits (and tenants never share blocks).

Every answer's status is counted (:class:`TrafficStats`); what is wrong in a 200 answer (an
error event mid-stream, a cut stream, a stop string in the text, a wrong number of choices,
invalid JSON) is an *anomaly*; so is a 4xx answer that is not the expected one.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from openai_stream import SSEDecoder, parse_payload

SYSTEM_PROMPTS = {
    "alpha": [
        "You are Alpha Support, the help desk assistant of a company that sells garden tools. "
        "Answer politely and briefly, in plain English, without lists. If a question is not "
        "about gardening, tools, orders or deliveries, say that you can only help with those. "
        "Never invent order numbers, prices or delivery dates; ask the customer for details.",
        "You are a patient tutor of elementary arithmetic for children aged seven to ten. "
        "Explain every step in one short sentence, use small numbers in examples, and end "
        "each answer with one encouraging remark. Do not use any formulas or symbols.",
    ],
    "beta": [
        "You are Beta, a concise technical writer. You rewrite the user's text so that it is "
        "clear, short and correct, keeping its meaning. Prefer active voice and common words. "
        "Return only the rewritten text, without any comments, quotes or explanations.",
        "You are a travel planner for weekend trips by train in central Europe. Suggest one "
        "destination at a time, with one sentence on why it is worth a visit and one on how "
        "to get there. Keep a friendly tone and do not mention prices or exact timetables.",
    ],
    "gamma": [
        "You are Gamma, a cooking assistant who only suggests vegetarian recipes with at most "
        "six ingredients that are easy to find in any supermarket. Give the dish name first, "
        "then the steps in a few sentences. Mention the cooking time at the end.",
    ],
}
QUESTIONS = [
    "How do I keep my shears sharp?", "What is seven plus five?", "Rewrite: the cat was sat "
    "on by the dog.", "Where should I go this weekend?", "What can I cook with lentils?",
    "When will my order arrive?", "Explain subtraction with apples.", "Suggest a city with "
    "old castles.", "Rewrite: it is known by many that the meeting has been moved.",
    "Give me a quick soup recipe.", "Which rake is best for leaves?", "What is nine minus four?",
]
COMPLETION_PROMPTS = [
    "The three most important rules of gardening are", "Once upon a time, in a small village "
    "by the sea, there lived", "A good recipe for tomato soup starts with", "The train from "
    "Vienna to Prague", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]
STOPS = [[".", "\n"], ["!", "?", "."], [","], ["\n"]]

MIX = {"chat_stream": 30, "vanish": 12, "chat": 6, "n_choices": 8, "stop": 10,
       "json_object": 4, "completion": 12, "bad_request": 12}


@dataclass
class TrafficStats:
    """What the clients saw."""

    statuses: Counter[int] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    bad_cases: Counter[str] = field(default_factory=Counter)
    transport_errors: Counter[str] = field(default_factory=Counter)
    anomalies: list[str] = field(default_factory=list)
    vanished: int = 0
    cancelled_at_end: int = 0
    completed: int = 0
    in_flight: int = 0
    output_chunks: int = 0

    def status_classes(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for status, count in self.statuses.items():
            out[f"{status // 100}xx"] += count
        return dict(sorted(out.items()))

    def anomaly(self, what: str) -> None:
        if len(self.anomalies) < 200:
            self.anomalies.append(what)

    def to_json(self) -> dict[str, Any]:
        return {"statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "classes": self.status_classes(), "kinds": dict(self.kinds),
                "bad_cases": dict(self.bad_cases),
                "transport_errors": dict(self.transport_errors),
                "anomalies": self.anomalies, "vanished": self.vanished,
                "cancelled_at_end": self.cancelled_at_end,
                "completed": self.completed, "output_chunks": self.output_chunks}


@dataclass
class StreamResult:
    """The joined outputs of one SSE stream, per choice index."""

    texts: dict[int, str] = field(default_factory=dict)
    finish: dict[int, str] = field(default_factory=dict)
    chunks: int = 0
    done: bool = False
    error: str | None = None

    def event(self, data: str) -> None:
        payload = parse_payload(data)
        self.done = self.done or payload.done
        self.error = payload.error or self.error
        if payload.obj is None:
            return
        for choice in payload.obj.get("choices") or []:
            i = choice.get("index", 0)
            delta = choice.get("delta")
            text = (delta or {}).get("content") if delta is not None else choice.get("text")
            if text:
                self.texts[i] = self.texts.get(i, "") + text
                self.chunks += 1
            if choice.get("finish_reason"):
                self.finish[i] = choice["finish_reason"]


@dataclass
class Client:
    """One server's endpoints and tenants, shared by the workers."""

    session: aiohttp.ClientSession
    root: str  # http://host:port
    model: str | None
    keys: dict[str, str]  # API key -> tenant ("" -> "default": no keys)
    stats: TrafficStats
    timeout_s: float = 120.0

    def headers(self, key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def body(self, **fields: Any) -> dict[str, Any]:
        return {"model": self.model, **fields} if self.model else dict(fields)

    async def post(self, path: str, body: Any, key: str | None, *, raw: bytes | None = None,
                   read: Callable[[aiohttp.ClientResponse], Awaitable[Any]] | None = None
                   ) -> tuple[int, Any]:
        """POST and count the status; returns it and ``read(resp)`` (default: the JSON or
        text body). Transport failures are counted and return status 0."""
        headers = {"Content-Type": "application/json", **self.headers(key)}
        data = raw if raw is not None else json.dumps(body).encode()
        try:
            async with asyncio.timeout(self.timeout_s), \
                    self.session.post(f"{self.root}{path}", data=data, headers=headers) as resp:
                self.stats.statuses[resp.status] += 1
                if read is not None and resp.status == 200:
                    return resp.status, await read(resp)
                text = await resp.text()
                try:
                    return resp.status, json.loads(text)
                except ValueError:
                    return resp.status, text
        except TimeoutError:
            self.stats.transport_errors["timeout"] += 1
            self.stats.anomaly(f"{path}: no answer within {self.timeout_s:.0f} s")
        except (aiohttp.ClientError, OSError) as e:
            self.stats.transport_errors[type(e).__name__] += 1
            self.stats.anomaly(f"{path}: {type(e).__name__}: {e}")
        return 0, None


async def read_stream(resp: aiohttp.ClientResponse, vanish_after: int | None = None
                      ) -> StreamResult:
    """Read an SSE stream; with ``vanish_after``, drop the connection after that many
    content chunks (the client that goes away mid-stream)."""
    out, decoder = StreamResult(), SSEDecoder()
    async for raw in resp.content.iter_any():
        for data in decoder.feed(raw):
            out.event(data)
        if vanish_after is not None and out.chunks >= vanish_after:
            resp.close()  # close the connection, not release it to the pool
            return out
    for data in decoder.close():
        out.event(data)
    return out


def chat_messages(rng: random.Random, tenant: str, extra: str = "") -> list[dict[str, str]]:
    prompts = SYSTEM_PROMPTS.get(tenant) or [p for ps in SYSTEM_PROMPTS.values() for p in ps]
    question = f"{rng.choice(QUESTIONS)} (ticket {rng.randrange(10_000)}){extra}"
    return [{"role": "system", "content": rng.choice(prompts)},
            {"role": "user", "content": question}]


class Traffic:
    """The weighted mix of request kinds over one :class:`Client`."""

    def __init__(self, client: Client, seed: int) -> None:
        self.c = client
        self.seed = seed
        self.kinds: dict[str, Callable[[random.Random, str | None, str], Awaitable[None]]] = {
            "chat_stream": self.chat_stream, "vanish": self.vanish, "chat": self.chat,
            "n_choices": self.n_choices, "stop": self.stop, "json_object": self.json_object,
            "completion": self.completion, "bad_request": self.bad_request}

    def _check_stream(self, kind: str, res: StreamResult | None, n: int = 1) -> None:
        if res is None:
            return
        st = self.c.stats
        st.output_chunks += res.chunks
        if res.error:
            st.anomaly(f"{kind}: {res.error}")
        elif not res.done or len(res.finish) != n:
            st.anomaly(f"{kind}: stream ended without [DONE] or a finish reason per choice "
                       f"({len(res.finish)} of {n})")

    async def chat_stream(self, rng: random.Random, key: str | None, tenant: str) -> None:
        body = self.c.body(messages=chat_messages(rng, tenant), stream=True,
                           max_tokens=rng.randint(8, 40), temperature=0.7,
                           stream_options={"include_usage": True})
        _, res = await self.c.post("/v1/chat/completions", body, key, read=read_stream)
        self._check_stream("chat_stream", res)

    async def vanish(self, rng: random.Random, key: str | None, tenant: str) -> None:
        body = self.c.body(messages=chat_messages(rng, tenant), stream=True, max_tokens=64,
                           temperature=0.8, ignore_eos=True)
        after = rng.randint(1, 4)

        async def read(resp: aiohttp.ClientResponse) -> StreamResult:
            return await read_stream(resp, vanish_after=after)
        status, res = await self.c.post("/v1/chat/completions", body, key, read=read)
        if status == 200 and res is not None:
            self.c.stats.vanished += 1
            self.c.stats.output_chunks += res.chunks
            if res.error:
                self.c.stats.anomaly(f"vanish: {res.error}")

    async def chat(self, rng: random.Random, key: str | None, tenant: str) -> None:
        body = self.c.body(messages=chat_messages(rng, tenant), max_tokens=rng.randint(8, 32),
                           temperature=0.7)
        status, doc = await self.c.post("/v1/chat/completions", body, key)
        if status == 200 and not (isinstance(doc, dict) and len(doc.get("choices", [])) == 1):
            self.c.stats.anomaly(f"chat: unexpected answer {str(doc)[:200]}")

    async def n_choices(self, rng: random.Random, key: str | None, tenant: str) -> None:
        n = rng.randint(2, 3)
        body = self.c.body(messages=chat_messages(rng, tenant), max_tokens=rng.randint(8, 24),
                           temperature=0.9, n=n)
        if rng.random() < 0.5:
            body["stream"] = True
            _, res = await self.c.post("/v1/chat/completions", body, key, read=read_stream)
            self._check_stream("n_choices", res, n)
            return
        status, doc = await self.c.post("/v1/chat/completions", body, key)
        if status == 200 and len((doc or {}).get("choices", [])) != n:
            self.c.stats.anomaly(f"n_choices: asked n={n}, got {str(doc)[:200]}")

    async def stop(self, rng: random.Random, key: str | None, tenant: str) -> None:
        stops = rng.choice(STOPS)
        body = self.c.body(messages=chat_messages(rng, tenant), max_tokens=rng.randint(16, 40),
                           temperature=0.7, stop=stops, stream=True)
        _, res = await self.c.post("/v1/chat/completions", body, key, read=read_stream)
        self._check_stream("stop", res)
        if res is not None and any(s in t for t in res.texts.values() for s in stops):
            self.c.stats.anomaly(f"stop: a stop string of {stops} is in {res.texts}")

    async def json_object(self, rng: random.Random, key: str | None, tenant: str) -> None:
        body = self.c.body(messages=chat_messages(rng, tenant, " Answer in JSON."),
                           max_tokens=48, temperature=0.5,
                           response_format={"type": "json_object"})
        status, doc = await self.c.post("/v1/chat/completions", body, key)
        if status != 200 or not isinstance(doc, dict):
            return
        choice = (doc.get("choices") or [{}])[0]
        if choice.get("finish_reason") == "stop":
            try:
                json.loads(choice["message"]["content"])
            except (KeyError, TypeError, ValueError):
                self.c.stats.anomaly(f"json_object: not JSON: {str(choice)[:200]}")

    async def completion(self, rng: random.Random, key: str | None, tenant: str) -> None:
        body = self.c.body(prompt=rng.choice(COMPLETION_PROMPTS), max_tokens=rng.randint(8, 32),
                           temperature=0.8)
        if rng.random() < 0.5:
            body["stream"] = True
            _, res = await self.c.post("/v1/completions", body, key, read=read_stream)
            self._check_stream("completion", res)
            return
        status, doc = await self.c.post("/v1/completions", body, key)
        if status == 200 and not (isinstance(doc, dict) and doc.get("choices")):
            self.c.stats.anomaly(f"completion: unexpected answer {str(doc)[:200]}")

    def bad_cases(self, rng: random.Random, tenant: str) -> list[tuple[str, str, Any, int]]:
        """(name, path, body -- bytes for a raw body --, expected status)."""
        msgs = chat_messages(rng, tenant)
        chat = "/v1/chat/completions"
        return [
            ("truncated_json", chat, b'{"messages": [{"role": "user", "content": "hi"', 400),
            ("not_json", chat, b"hello, server", 400),
            ("messages_not_list", chat, self.c.body(messages="hello"), 400),
            ("missing_messages", chat, self.c.body(max_tokens=8), 400),
            ("empty_messages", chat, self.c.body(messages=[], max_tokens=8), 400),
            ("message_without_role", chat, self.c.body(messages=[{"content": "x"}],
                                                       max_tokens=8), 400),
            ("content_not_text", chat, self.c.body(messages=[{"role": "user", "content": 5}],
                                                   max_tokens=8), 400),
            ("top_logprobs_too_many", chat,
             self.c.body(messages=msgs, max_tokens=8, logprobs=True, top_logprobs=99), 400),
            ("stop_not_text", chat, self.c.body(messages=msgs, max_tokens=8, stop=7), 400),
            ("unknown_model", chat, {"model": "no-such-model", "messages": msgs,
                                     "max_tokens": 8}, 404),
            ("max_tokens_zero", chat, self.c.body(messages=msgs, max_tokens=0), 400),
            ("temperature_negative", chat, self.c.body(messages=msgs, temperature=-1), 400),
            ("n_zero", chat, self.c.body(messages=msgs, n=0), 400),
            ("top_p_too_big", chat, self.c.body(messages=msgs, top_p=7.5), 400),
            ("max_tokens_past_context", chat,
             self.c.body(messages=msgs, max_tokens=10_000_000), 400),
            ("bad_response_format", chat,
             self.c.body(messages=msgs, response_format={"type": "no_such_format"}), 400),
            ("empty_prompt", "/v1/completions", self.c.body(prompt=[]), 400),
            ("wrong_key", chat, self.c.body(messages=msgs, max_tokens=4), 401),
        ]

    async def bad_request(self, rng: random.Random, key: str | None, tenant: str) -> None:
        name, path, body, expected = rng.choice(self.bad_cases(rng, tenant))
        if name == "wrong_key":
            if not self.c.keys:
                return  # a server without keys accepts any
            key = "not-a-key"
        raw = body if isinstance(body, bytes) else None
        self.c.stats.bad_cases[name] += 1
        status, doc = await self.c.post(path, body, key, raw=raw)
        if status == 0:
            return
        err = doc.get("error") if isinstance(doc, dict) else None
        if status != expected or not (isinstance(err, dict) and err.get("message")
                                      and err.get("type")):
            self.c.stats.anomaly(f"bad_request {name}: expected {expected} with an error "
                                 f"object, got {status} {str(doc)[:200]}")

    async def worker(self, index: int, deadline: float) -> None:
        rng = random.Random(self.seed * 1000 + index)
        names, weights = list(MIX), list(MIX.values())
        keys = list(self.c.keys.items()) or [("", "default")]
        st = self.c.stats
        while time.monotonic() < deadline:
            kind = rng.choices(names, weights)[0]
            key, tenant = rng.choice(keys)
            st.kinds[kind] += 1
            st.in_flight += 1
            try:
                await self.kinds[kind](rng, key or None, tenant)
            finally:
                st.in_flight -= 1
                st.completed += 1

    async def run(self, concurrency: int, duration_s: float, finish_s: float) -> int:
        """Send until ``duration_s`` passes, let the requests in flight finish for up to
        ``finish_s``, then cancel the rest (their clients vanish); returns how many were
        cancelled."""
        deadline = time.monotonic() + duration_s
        tasks = [asyncio.create_task(self.worker(i, deadline)) for i in range(concurrency)]
        _, pending = await asyncio.wait(tasks, timeout=duration_s + finish_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:  # a worker that failed is a bug of the soak: re-raise it
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        self.c.stats.cancelled_at_end = len(pending)
        return len(pending)


async def greedy_answer(client: Client, key: str | None) -> str | None:
    """The fixed greedy probe (temperature 0, max_tokens 32): its text, None on failure."""
    body = client.body(messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "List the planets of the solar system in order."}],
        max_tokens=32, temperature=0)
    status, doc = await client.post("/v1/chat/completions", body, key)
    if status != 200 or not isinstance(doc, dict):
        return None
    return doc["choices"][0]["message"]["content"]
