"""Request limits: body size (413), body arrival time (408), context length (400), request
time (504).

The front end reads the body and answers :func:`body_too_large` past
``server.max_body_bytes`` and :class:`BodyReadTimeout` past ``server.body_read_timeout_s``
(then closes the connection: reading the rest of a slow body would keep it); the queue
bounds (429) are the engine's (``[scheduler] max_waiting`` and ``max_waiting_tokens``):
:func:`~hermes_async.openai.errors.to_api_error` turns its ``QueueFullError`` into 429 with
``Retry-After``.
"""

from __future__ import annotations

import time

from hermes_async.openai.errors import APIError, context_length_error


def body_too_large(max_bytes: int, actual: int | None) -> APIError:
    """413 ``request_too_large`` (``actual``: the announced length, if known)."""
    size = f" ({actual} bytes)" if actual is not None else ""
    return APIError(413, f"the request body{size} is larger than the limit of {max_bytes} "
                    "bytes", code="request_too_large")


class BodyReadTimeout(APIError):
    """408 ``request_timeout``: the body did not arrive in time."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(408, f"the request body did not arrive within {timeout_s:g} s",
                         type="timeout_error", code="request_timeout")


def check_context(param: str, prompt_tokens: int, max_tokens: int | None,
                  max_model_len: int) -> None:
    """400 ``context_length_exceeded`` when the prompt leaves no room to generate, or prompt
    plus ``max_tokens`` is over the model's context."""
    if prompt_tokens >= max_model_len or (
            max_tokens is not None and prompt_tokens + max_tokens > max_model_len):
        raise context_length_error(param, max_model_len, prompt_tokens, max_tokens)


class Deadline:
    """The end of a request's time budget (``server.request_timeout_s``; ``None``: none)."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self._end = None if timeout_s is None else time.monotonic() + timeout_s

    def remaining(self) -> float | None:
        """Seconds left (never negative), ``None`` without a limit."""
        return None if self._end is None else max(0.0, self._end - time.monotonic())

    def error(self) -> APIError:
        """504 ``request_timeout``."""
        return APIError(504, f"the request did not finish within {self.timeout_s} s and was "
                        "aborted", type="timeout_error", code="request_timeout")
