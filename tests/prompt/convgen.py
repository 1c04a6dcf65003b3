"""Random OpenAI-style conversations for the oracle tests (deterministic per seed).

Contents mix empty and whitespace-only strings, leading/trailing spaces and newlines, multi-line
text, unicode (accents, CJK, emoji, RTL, combining marks), long text, code with ``<``/``>``/``|``
(but never a whole control-token string), and fragments at the edges that look like the start
or end of one (``<|``, ``|>``, ``[``, ``]``).
"""

from __future__ import annotations

import random
from typing import Any

WORDS = (
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world",
    "tokenizer", "prompt", "cache", "assistant", "tool", "weather", "Paris", "42", "3.14",
    "naïve", "café", "déjà", "Köln", "你好", "世界", "こんにちは", "🙂", "🚀", "مرحبا", "שלום",
    "e\u0301", "x86_64", "foo_bar", "camelCase",
)

PIECES = (
    "", " ", "  ", "\n", "\n\n", " \n ", "\t", "\r\n", "\n\n\n", "   \n\t  ",
    "a < b", "x > y", "a | b", "<html>", "</div>", "<|", "|>", "<", ">", "|", "[", "]",
    "[INST", "INST]", "<|im_", "_end|>", "def f(x):\n    return x\n", "```python\nprint(1)\n```",
    '{"a": 1, "b": [1, 2]}', "   leading", "trailing   ", "\n\nnewlines around\n\n",
    "UPPER lower 123 456", "emoji 🙂🙂 🚀", "العربية", "עברית", "中文字符", "e\u0301\u0301",
)


def random_text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.10:
        return rng.choice(("", " ", "  ", "\n", "\n\n", "\t \n"))
    if kind < 0.20:  # long
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(150, 400)))
    parts = []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.5:
            parts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))))
        else:
            parts.append(rng.choice(PIECES))
        parts.append(rng.choice(("", " ", "\n", "", "\n\n")))
    return "".join(parts)


def _content(rng: random.Random) -> Any:
    text = random_text(rng)
    if rng.random() < 0.1:
        return [{"type": "text", "text": text}, {"type": "text", "text": random_text(rng)}]
    return text


def random_conversation(rng: random.Random, *, tools: bool = False) -> list[dict[str, Any]]:
    """A conversation: optional system, then user/assistant turns with tool calls and results,
    optional names and legacy role spellings; ends with a user or tool message."""
    msgs: list[dict[str, Any]] = []
    if rng.random() < 0.6:
        msgs.append({"role": rng.choice(("system", "system", "system_prompt")),
                     "content": _content(rng)})
    call = 0
    for _ in range(rng.randint(1, 6)):
        user: dict[str, Any] = {"role": rng.choice(("user", "user", "user", "human")),
                                "content": _content(rng)}
        if rng.random() < 0.15:
            user["name"] = rng.choice(("alice", "bob_2", "Zoë"))
        msgs.append(user)
        if tools and rng.random() < 0.3:
            n = rng.randint(1, 2)
            calls = []
            for _ in range(n):
                call += 1
                calls.append({"id": f"call_{call}", "type": "function", "function": {
                    "name": rng.choice(("get_weather", "search")),
                    "arguments": rng.choice(('{"city": "Paris"}', '{"q": "naïve <b>"}', "{}"))}})
            msgs.append({"role": "assistant", "content": rng.choice((None, "", "Let me check.")),
                         "tool_calls": calls})
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "content": _content(rng)})
        msgs.append({"role": rng.choice(("assistant", "assistant", "bot")),
                     "content": _content(rng)})
    msgs.append({"role": "user", "content": _content(rng)})
    return msgs


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city <b>now</b>",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
