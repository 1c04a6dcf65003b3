"""Response pieces both completion endpoints share: the ``usage`` object, the fields every
response or chunk repeats, and the :class:`ChunkFormatter` base of the streamed chunks."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any

from hermes_async import __version__
from hermes_async.engine.request import RequestOutput, Usage

SYSTEM_FINGERPRINT = f"hermes-async-{__version__}"


def usage_dict(usage: Usage) -> dict[str, Any]:
    """OpenAI's ``usage`` object, with ``prompt_tokens_details.cached_tokens``; where
    speculative decoding verified drafts for the request, ``completion_tokens_details`` with
    OpenAI's ``accepted_prediction_tokens`` / ``rejected_prediction_tokens`` (drafted tokens
    kept in the answer / computed and dropped)."""
    out = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
           "total_tokens": usage.total_tokens,
           "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}
    if usage.draft_tokens:
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": usage.accepted_draft_tokens,
            "rejected_prediction_tokens": usage.draft_tokens - usage.accepted_draft_tokens}
    return out


def response_head(request_id: str, obj: str, model: str) -> dict[str, Any]:
    """``id``, ``object``, ``created`` (now), ``model`` and ``system_fingerprint``."""
    return {"id": request_id, "object": obj, "created": int(time.time()), "model": model,
            "system_fingerprint": SYSTEM_FINGERPRINT}


class ChunkFormatter(ABC):
    """Turns engine outputs into OpenAI chunk objects; chat and completions subclass it.

    ``head`` holds the fields every chunk repeats (id, object, created, model). With
    ``include_usage`` every chunk carries ``"usage": null`` and a last chunk the usage, as
    OpenAI streams do.
    """

    def __init__(self, head: dict[str, Any], include_usage: bool) -> None:
        self.head, self.include_usage = head, include_usage

    def chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        """One chunk holding ``choice``."""
        out = {**self.head, "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out

    def prelude(self) -> list[dict[str, Any]]:
        """Chunks sent before any output (chat: the ``role`` deltas)."""
        return []

    @abstractmethod
    def on_output(self, prompt_index: int, out: RequestOutput) -> list[dict[str, Any]]:
        """Chunks for one output (text delta, then a finish chunk when it finishes)."""

    def epilogue(self, usage: Usage) -> list[dict[str, Any]]:
        """Chunks after the last output (the ``usage`` chunk when asked for)."""
        if not self.include_usage:
            return []
        return [{**self.head, "choices": [], "usage": usage_dict(usage)}]
