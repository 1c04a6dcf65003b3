"""Log probabilities in OpenAI's two shapes.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}]}], "refusal": null}``. Completions: ``{"tokens", "token_logprobs", "top_logprobs":
[{token: logprob}], "text_offset"}``. Token strings are the tokenizer's decoding of the single
id (special tokens included); ``bytes`` their UTF-8 encoding.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hermes_async.engine.request import TokenLogprob


class TokenTexts:
    """Decoded text of single token ids, memoized (one per response)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._memo: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._memo.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._memo[token_id] = text
        return text


def _chat_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(entries: Iterable[TokenLogprob], texts: TokenTexts) -> dict[str, Any]:
    """A chat choice's (or chunk's) ``logprobs`` object."""
    content = []
    for e in entries:
        item = _chat_entry(texts(e.token_id), e.logprob)
        item["top_logprobs"] = [_chat_entry(texts(t), lp) for t, lp in e.top]
        content.append(item)
    return {"content": content, "refusal": None}


class CompletionLogprobs:
    """Formats completions ``logprobs`` chunk by chunk, continuing ``text_offset``."""

    def __init__(self, texts: TokenTexts, offset: int = 0) -> None:
        self.texts = texts
        self.offset = offset

    def format(self, entries: Iterable[TokenLogprob]) -> dict[str, Any]:
        """The ``logprobs`` object of these tokens; offsets continue from the last call."""
        tokens, values, tops, offsets = [], [], [], []
        for e in entries:
            token = self.texts(e.token_id)
            tokens.append(token)
            values.append(e.logprob)
            tops.append({self.texts(t): lp for t, lp in e.top} or None)
            offsets.append(self.offset)
            self.offset += len(token)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}
