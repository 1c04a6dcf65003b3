"""The one rule for tokenizing raw text (not chat messages) anywhere in hermes_async.

Raw text -- a ``/v1/completions`` prompt, a ``/tokenize`` prompt, a ``/cache/warm`` prompt, a
text prompt given to ``AsyncEngine.generate``/``warm`` and a ``prompt`` line read by the
doctor -- is encoded with ``add_special_tokens=True`` unless the caller says otherwise, as vLLM
does: a model whose tokenizer adds a BOS token gets it, so a warmed text prompt and the same
text through ``/v1/completions`` share their cached prefix. Chat messages never go through
here: their control tokens come from the chat template only (see ``prompt.tokenize``).
"""

from __future__ import annotations

from typing import Any

ADD_SPECIAL_TOKENS_DEFAULT = True


def encode_text(tokenizer: Any, text: str, add_special_tokens: bool | None = None) -> list[int]:
    """Token ids of raw ``text``; ``add_special_tokens`` None means the project's default."""
    special = ADD_SPECIAL_TOKENS_DEFAULT if add_special_tokens is None else add_special_tokens
    return list(tokenizer.encode(text, add_special_tokens=special))
