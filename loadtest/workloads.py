"""Workloads for the load tests: named, seeded generators of OpenAI chat requests, shared by
``locustfile.py`` and ``bench_serving.py`` (import as ``from workloads import ...``).

A request is a dict: ``messages``, ``max_tokens``, optionally ``tools``, and ``meta`` (workload
name, request index, user/tenant id, turn index; not sent to the server, see
:func:`openai_body`). Text is readable filler from word lists, deterministic per seed. Sizes are
in tokens: exact with a tokenizer (``load_tokenizer(model_dir)``), else estimated at
:data:`TOKENS_PER_WORD`.

    wl = make_workload("shared_system", system_tokens=1000, seed=0)
    req = wl.next_request()            # send it; then, for multi-turn conversations:
    wl.record_response(req, answer)    # the server's answer text (None: a canned answer)
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import random
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

TOKENS_PER_WORD = 1.15  # this filler under SmolLM2's BPE tokenizer (English prose: ~1.3)

ADJECTIVES = ("quiet", "green", "early", "careful", "small", "northern", "bright", "patient",
              "heavy", "simple", "modern", "local", "friendly", "urgent", "standard", "rare",
              "wooden", "public", "annual", "fragile", "seasonal", "digital", "regular", "free")
NOUNS = ("parcel", "customer", "warehouse", "invoice", "driver", "order", "lamp", "garden",
         "ticket", "refund", "account", "bicycle", "harbour", "printer", "contract", "meeting",
         "label", "courier", "report", "station", "kettle", "schedule", "partner", "window")
VERBS = ("checks", "ships", "returns", "updates", "answers", "prepares", "records", "collects",
         "repairs", "confirms", "reviews", "delivers", "explains", "plans",
         "sorts", "tracks", "signs", "packs", "cancels", "approves")
ADVERBS = ("promptly", "politely", "twice", "carefully", "before noon", "every Monday",
           "without delay", "on request", "in writing", "by phone", "at once", "each quarter")
TOPICS = ("delivery times", "the refund policy", "a damaged lamp", "opening hours",
          "my invoice", "changing an address", "bulk orders", "gift wrapping", "a lost parcel",
          "payment by card", "the loyalty programme", "shipping to Norway", "a broken kettle",
          "the warranty", "express shipping", "a missing label")
ASKS = ("Can you tell me about {t}?", "What should I know about {t}?",
        "I have a question on {t}.", "How do you handle {t}?", "Please explain {t} briefly.",
        "Is there anything special about {t} this week?", "Who do I contact about {t}?")
CITIES = ("Lyon", "Porto", "Gdansk", "Oslo", "Bilbao", "Turin", "Ghent", "Leeds", "Brno")
CANNED_ANSWER = ("Thank you for your message. I have checked your request and everything is "
                 "in order; is there anything else I can help you with?")


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` without a tokenizer: words times :data:`TOKENS_PER_WORD`."""
    return round(len(text.split()) * TOKENS_PER_WORD)


def count_tokens(text: str, tokenizer: Any = None) -> int:
    """Tokens of ``text`` (no special tokens) under ``tokenizer``, else estimated."""
    if tokenizer is None:
        return estimate_tokens(text)
    return len(tokenizer.encode(text, add_special_tokens=False))


def load_tokenizer(model_dir: str) -> Any:
    """A ``transformers`` tokenizer from a local model directory (nothing is downloaded)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


def sentence(rng: random.Random) -> str:
    """One filler sentence, e.g. "The careful driver ships the green parcel promptly."."""
    return (f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the "
            f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(ADVERBS)}.")


def filler(rng: random.Random, n_tokens: int, tokenizer: Any = None, lead: str = "") -> str:
    """``lead`` plus filler sentences, ``n_tokens`` tokens in all (exact to a word with a
    tokenizer, a binary search over the number of words; estimated without one)."""
    budget = n_tokens / TOKENS_PER_WORD * (1.3 if tokenizer is not None else 1.0) + 12
    words = lead.split()
    while len(words) < budget:
        words += sentence(rng).split()
    if tokenizer is None:
        k = max(1, round(n_tokens / TOKENS_PER_WORD))
        return " ".join(words[:k])
    while count_tokens(" ".join(words), tokenizer) < n_tokens:  # the estimate fell short
        words += sentence(rng).split()
    lo, hi = 1, len(words)  # smallest k with count(words[:k]) >= n_tokens
    while lo < hi:
        mid = (lo + hi) // 2
        if count_tokens(" ".join(words[:mid]), tokenizer) >= n_tokens:
            hi = mid
        else:
            lo = mid + 1
    return " ".join(words[:lo])


def question(rng: random.Random, index: int) -> str:
    """A short, varied user question (about 15-30 tokens)."""
    ask = rng.choice(ASKS).format(t=rng.choice(TOPICS))
    return f"Request {index} from {rng.choice(CITIES)}: {ask} {sentence(rng)}"


def openai_body(request: dict[str, Any], model: str, *, stream: bool = True,
                temperature: float | None = 0.0, ignore_eos: bool = False) -> dict[str, Any]:
    """The JSON body of ``POST /v1/chat/completions`` for a workload request (``meta`` is
    dropped; streaming asks for the usage chunk; ``ignore_eos`` is vLLM's extra)."""
    body: dict[str, Any] = {"model": model, "messages": request["messages"],
                            "max_tokens": request["max_tokens"], "stream": stream}
    if request.get("tools"):
        body["tools"] = request["tools"]
    if stream:
        body["stream_options"] = {"include_usage": True}
    if temperature is not None:
        body["temperature"] = temperature
    if ignore_eos:
        body["ignore_eos"] = True
    return body


class Workload(ABC):
    """Base class: ``next_request()`` builds request ``i`` (0, 1, ...); ``record_response``
    feeds back an answer (only multi-turn conversations use it)."""

    name = "base"
    text_key = ""  # names the fixed texts; defaults to ``name``

    def __init__(self, *, seed: int = 0, max_tokens: int = 64, tokenizer: Any = None) -> None:
        self.seed = seed
        self.max_tokens = max_tokens
        self.tokenizer = tokenizer
        self.index = 0
        self.rng = random.Random(f"{self.text_key or self.name}:{seed}:requests")

    def text_rng(self, *key: object) -> random.Random:
        """A generator for fixed text named by ``key`` (same seed and key: same text)."""
        return random.Random(":".join(map(str, (self.text_key or self.name, self.seed, *key))))

    def next_request(self) -> dict[str, Any]:
        req = self.build(self.index)
        req.setdefault("max_tokens", self.max_tokens)
        req["meta"] = {"workload": self.name, "index": self.index, **req.get("meta", {})}
        self.index += 1
        return req

    @abstractmethod
    def build(self, i: int) -> dict[str, Any]:
        """Request ``i``: ``messages`` (and optional ``tools``, ``max_tokens``, ``meta``)."""

    def record_response(self, request: dict[str, Any], answer: str | None) -> None:
        """The server's answer to ``request`` (None when it failed or was not recorded)."""
        del request, answer  # only multi-turn conversations keep answers

    def iter_requests(self, n: int) -> Iterator[dict[str, Any]]:
        """``n`` requests in order, each answered with the canned answer."""
        for _ in range(n):
            req = self.next_request()
            yield req
            self.record_response(req, None)


class SharedSystem(Workload):
    """A fixed long system prompt (``system_tokens``) and a varied short question per request:
    every request after the first should find the whole system prompt in the prefix cache."""

    name = "shared_system"

    def __init__(self, *, system_tokens: int = 1000, **kw: Any) -> None:
        super().__init__(**kw)
        self.system_tokens = system_tokens
        lead = "You are the support assistant of Hermes Logistics. Follow these notes."
        self.system = filler(self.text_rng("system"), system_tokens, self.tokenizer, lead)

    def system_prompt(self, i: int) -> str:
        return self.system

    def build(self, i: int) -> dict[str, Any]:
        return {"messages": [{"role": "system", "content": self.system_prompt(i)},
                             {"role": "user", "content": question(self.rng, i)}]}


class DynamicField(SharedSystem):
    """The shared_system prompt with a distinct timestamp on its first line (the classic
    production pitfall): no two prompts share their first 32-token block (the digits that
    change sit about 25 tokens in), so its TTFT is that of an uncached system prompt of the
    same size (a server with 16-token blocks may share one block: 2% of 1000 tokens)."""

    name = "dynamic_field"
    text_key = "shared_system"  # the same system prompt and questions as shared_system
    START = dt.datetime(2026, 11, 29, 20, 31, 7, 123456, tzinfo=dt.UTC)

    def __init__(self, *, step_ms: int = 137, **kw: Any) -> None:
        super().__init__(**kw)
        self.step_ms = step_ms

    def timestamp(self, i: int) -> str:
        t = self.START + dt.timedelta(milliseconds=self.step_ms * i, seconds=self.seed * 86400)
        return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def system_prompt(self, i: int) -> str:
        return f"Current time: {self.timestamp(i)}\n{self.system}"


class MultiTurn(Workload):
    """Growing conversations: each turn resends the whole history (a shared system prompt,
    earlier questions and the answers the server gave) plus a new question, so turn k should
    find turn k-1's prompt cached. ``users`` conversations are interleaved; one whose turn is
    in flight is skipped (another user starts when all are busy); after ``turns`` turns a
    conversation starts afresh."""

    name = "multi_turn"

    def __init__(self, *, users: int = 8, turns: int = 8, system_tokens: int = 300,
                 **kw: Any) -> None:
        super().__init__(**kw)
        self.turns = turns
        lead = "You are a helpful travel assistant. Keep these notes in mind."
        self.system = filler(self.text_rng("system"), system_tokens, self.tokenizer, lead)
        self.convs: list[dict[str, Any]] = [self._fresh(u) for u in range(users)]
        self.next_user = 0

    def _fresh(self, user: int, conversation: int = 0) -> dict[str, Any]:
        return {"user": user, "conversation": conversation, "turn": 0, "pending": False,
                "messages": [{"role": "system", "content": self.system}]}

    def build(self, i: int) -> dict[str, Any]:
        n = len(self.convs)
        for k in range(n):
            conv = self.convs[(self.next_user + k) % n]
            if not conv["pending"]:
                break
        else:
            conv = self._fresh(n)
            self.convs.append(conv)
        self.next_user = (conv["user"] + 1) % len(self.convs)
        if conv["turn"] >= self.turns:
            conv.update(self._fresh(conv["user"], conv["conversation"] + 1))
        conv["pending"] = True
        messages = [*conv["messages"], {"role": "user", "content": question(self.rng, i)}]
        return {"messages": messages, "meta": {"user": conv["user"], "turn": conv["turn"],
                                               "conversation": conv["conversation"]}}

    def record_response(self, request: dict[str, Any], answer: str | None) -> None:
        meta = request["meta"]
        conv = self.convs[meta["user"]]
        if not conv["pending"] or conv["conversation"] != meta["conversation"]:
            return
        reply = {"role": "assistant", "content": answer if answer else CANNED_ANSWER}
        conv["messages"] = [*request["messages"], reply]
        conv["turn"] += 1
        conv["pending"] = False


class Tenants(Workload):
    """``tenants`` tenants, each with its own long system prompt (disjoint from the first
    block), requests spread at random (``order="random"``) or in turn (``"round_robin"``):
    shows cache crowding once the tenants' prompts together outgrow the KV pool."""

    name = "tenants"

    def __init__(self, *, tenants: int = 16, system_tokens: int = 1000,
                 order: str = "random", **kw: Any) -> None:
        super().__init__(**kw)
        if order not in ("random", "round_robin"):
            raise ValueError(f"order must be 'random' or 'round_robin', not {order!r}")
        self.tenants, self.system_tokens, self.order = tenants, system_tokens, order
        self.systems: dict[int, str] = {}

    def system_prompt(self, tenant: int) -> str:
        if tenant not in self.systems:
            rng = self.text_rng("tenant", tenant)
            lead = (f"Tenant {tenant} handbook, {rng.choice(CITIES)} office: you are the "
                    "assistant of this tenant only.")
            self.systems[tenant] = filler(rng, self.system_tokens, self.tokenizer, lead)
        return self.systems[tenant]

    def build(self, i: int) -> dict[str, Any]:
        tenant = i % self.tenants if self.order == "round_robin" else self.rng.randrange(
            self.tenants)
        return {"messages": [{"role": "system", "content": self.system_prompt(tenant)},
                             {"role": "user", "content": question(self.rng, i)}],
                "meta": {"tenant": tenant}}


def _function(name: str, description: str, **props: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "required": list(props),
                       "properties": {k: {"type": "string", "description": v}
                                      for k, v in props.items()}}}}


TOOLS = [
    _function("get_weather", "Current weather of a city.", city="City name"),
    _function("track_parcel", "Where a parcel is now.", order_id="Ten-digit order number"),
    _function("convert_currency", "Converts an amount.", amount="Amount, e.g. 12.50",
              currency="ISO code of the target currency"),
]


class ToolCalls(Workload):
    """Tool-calling turns: ``tools`` schemas, a user question, the assistant's ``tool_calls``,
    the ``tool`` message with the result, then a follow-up question. The system prompt and
    tools are shared; the call, result and follow-up vary."""

    name = "tool_calls"

    def __init__(self, *, system_tokens: int = 300, **kw: Any) -> None:
        super().__init__(**kw)
        lead = "You are an assistant with tools. Call a tool when it helps."
        self.system = filler(self.text_rng("system"), system_tokens, self.tokenizer, lead)

    def call(self, i: int) -> tuple[str, str, dict[str, str], dict[str, Any]]:
        """(question, tool name, arguments, result) of request ``i``."""
        city, rng = self.rng.choice(CITIES), self.rng
        kind = rng.randrange(3)
        if kind == 0:
            return (f"What is the weather in {city}?", "get_weather", {"city": city},
                    {"city": city, "celsius": rng.randint(-5, 30), "sky": rng.choice(ADJECTIVES)})
        if kind == 1:
            oid = f"{rng.randrange(10**9, 10**10)}"
            return (f"Where is my parcel {oid}?", "track_parcel", {"order_id": oid},
                    {"order_id": oid, "at": f"{city} {rng.choice(NOUNS)} hub", "eta_days": 2})
        amount = f"{rng.randint(5, 500)}.{rng.randint(0, 99):02d}"
        return (f"How much is {amount} EUR in NOK?", "convert_currency",
                {"amount": amount, "currency": "NOK"},
                {"amount": amount, "currency": "NOK", "result": round(float(amount) * 11.7, 2)})

    def build(self, i: int) -> dict[str, Any]:
        ask, name, args, result = self.call(i)
        call_id = f"call_{self.seed}_{i}"
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": f"Request {i}: {ask}"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args)}}]},
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)},
            {"role": "user", "content": f"Thanks. {question(self.rng, i)}"},
        ]
        return {"messages": messages, "tools": copy.deepcopy(TOOLS)}


class NoReuse(Workload):
    """Short distinct prompts (``min_prompt_tokens`` to ``max_prompt_tokens``), no system
    prompt: nothing to share beyond the chat template's first tokens (the control)."""

    name = "no_reuse"

    def __init__(self, *, min_prompt_tokens: int = 30, max_prompt_tokens: int = 100,
                 **kw: Any) -> None:
        super().__init__(**kw)
        self.lo, self.hi = min_prompt_tokens, max_prompt_tokens

    def build(self, i: int) -> dict[str, Any]:
        lead = f"{self.rng.getrandbits(48):012x}: {self.rng.choice(TOPICS)}."
        text = filler(self.rng, self.rng.randint(self.lo, self.hi), self.tokenizer, lead)
        return {"messages": [{"role": "user", "content": text}]}


class PrefixShare(Workload):
    """Prompts of ``prompt_tokens`` tokens whose first ``share`` of tokens is common to all
    requests and the rest unique (one user message): TTFT against the shared fraction."""

    name = "prefix_share"

    def __init__(self, *, share: float = 0.5, prompt_tokens: int = 1024, **kw: Any) -> None:
        super().__init__(**kw)
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share must be in [0, 1], not {share}")
        self.share, self.prompt_tokens = share, prompt_tokens
        self.common_tokens = round(share * prompt_tokens)
        self.rng = random.Random(f"{self.name}:{self.seed}:{share}:requests")
        lead = "Read this shared briefing, then the case notes, and summarise."
        self.common = (filler(self.text_rng("common", share), self.common_tokens,
                              self.tokenizer, lead) if self.common_tokens else "")

    def build(self, i: int) -> dict[str, Any]:
        lead = f"Case {self.rng.getrandbits(48):012x}:"
        rest = max(self.prompt_tokens - self.common_tokens, 1)
        unique = filler(self.rng, rest, self.tokenizer, lead)
        text = f"{self.common}\n{unique}" if self.common else unique
        return {"messages": [{"role": "user", "content": text}],
                "meta": {"share": self.share}}


WORKLOADS: dict[str, type[Workload]] = {
    w.name: w for w in (SharedSystem, DynamicField, MultiTurn, Tenants, ToolCalls, NoReuse,
                        PrefixShare)}


def workload_params(name: str) -> set[str]:
    """The keyword parameters workload ``name`` accepts."""
    import inspect

    names: set[str] = set()
    for cls in WORKLOADS[name].__mro__:
        if "__init__" in vars(cls):
            names |= {p.name for p in inspect.signature(cls.__init__).parameters.values()
                      if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return names


def make_workload(name: str, *, strict: bool = True, **params: Any) -> Workload:
    """Workload ``name`` (a key of :data:`WORKLOADS`) with ``params``; ``strict=False`` drops
    the parameters it does not take (and those that are None)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    if not strict:
        known = workload_params(name)
        params = {k: v for k, v in params.items() if k in known and v is not None}
    return WORKLOADS[name](**params)
