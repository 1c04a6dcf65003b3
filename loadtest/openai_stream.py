"""One streamed OpenAI chat completion over aiohttp, timed: the client of ``bench_serving.py``
(import as ``from openai_stream import ...``).

Works against any OpenAI-compatible server: reads the SSE stream (``data:`` lines, comments
ignored, ``data: [DONE]`` ends it), takes the first chunk that carries content (or a tool call,
or reasoning text; for an empty answer, the chunk with the finish reason) as the first token,
the gaps between content chunks as inter-token latencies,
and token counts from the usage chunk (``stream_options.include_usage``) when the server sends
one.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp


@dataclass
class RequestRecord:
    """What one request measured (seconds; token counts None when the server did not say)."""

    index: int
    meta: dict[str, Any] = field(default_factory=dict)
    start: float = 0.0  # perf_counter at send
    ttft: float | None = None  # to the first content chunk (empty answer: the finish chunk)
    itls: list[float] = field(default_factory=list)  # between content chunks
    e2e: float | None = None  # to the end of the stream
    output_tokens: int | None = None  # usage.completion_tokens, else content chunks
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    chunks: int = 0  # content chunks
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None

    def to_json(self, *, with_text: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_text:
            d.pop("text")
        return d


@dataclass(frozen=True)
class Payload:
    """One SSE ``data`` payload of an OpenAI stream: ``[DONE]``, a chunk object, or what is
    wrong with it (not JSON, an error event)."""

    done: bool = False
    obj: dict[str, Any] | None = None
    error: str | None = None


def parse_payload(data: str) -> Payload:
    """``data`` as a :class:`Payload` (a JSON value that is not an object: neither)."""
    if data.strip() == "[DONE]":
        return Payload(done=True)
    try:
        obj = json.loads(data)
    except ValueError:
        return Payload(error=f"bad event: {data[:200]}")
    if not isinstance(obj, dict):
        return Payload()
    if obj.get("error"):
        return Payload(error=f"error event: {json.dumps(obj['error'])[:300]}")
    return Payload(obj=obj)


class SSEDecoder:
    """Bytes in, ``data`` payloads of complete events out (multi-line data joined by \\n)."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        return [e for line in lines if (e := self._line(line.rstrip(b"\r"))) is not None]

    def close(self) -> list[str]:
        """Events left when the stream ends (a last event without its blank line)."""
        events = self.feed(b"\n") if self._buf else []
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _line(self, line: bytes) -> str | None:
        if not line:
            if not self._data:
                return None
            event, self._data = "\n".join(self._data), []
            return event
        if line.startswith(b":"):
            return None  # a comment (keep-alive)
        name, _, value = line.partition(b":")
        if name == b"data":
            self._data.append(value.removeprefix(b" ").decode("utf-8", "replace"))
        return None


def chunk_text(chunk: dict[str, Any]) -> str | None:
    """The generated text of a chat chunk's first choice, "" for a tool-call delta, None when
    it carries nothing generated (the role chunk, the usage chunk, a bare finish reason)."""
    choices = chunk.get("choices") or []
    if not choices:
        return None
    delta = choices[0].get("delta") or {}
    text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
    if text:
        return text
    return "" if delta.get("tool_calls") else None


def apply_usage(rec: RequestRecord, usage: dict[str, Any]) -> None:
    """Token counts from a usage object."""
    rec.prompt_tokens = usage.get("prompt_tokens")
    rec.output_tokens = usage.get("completion_tokens", rec.output_tokens)
    details = usage.get("prompt_tokens_details") or {}
    rec.cached_tokens = details.get("cached_tokens")


class StreamTimer:
    """Fills a record from a stream's events as they arrive."""

    def __init__(self, rec: RequestRecord) -> None:
        self.rec = rec
        self.last_token = rec.start
        self.done = False

    def incomplete(self) -> str | None:
        """Why the stream, now ended, is incomplete (None: complete): neither ``[DONE]`` nor
        a finish chunk arrived (transformers serve ends after its finish chunk, no
        ``[DONE]``: accepted)."""
        if self.done or self.rec.finish_reason is not None:
            return None
        return "incomplete stream: no finish_reason and no data: [DONE]"

    def event(self, data: str, now: float) -> None:
        """One SSE ``data`` payload received at ``now`` (perf_counter)."""
        rec = self.rec
        payload = parse_payload(data)
        if payload.done:
            self.done = True
            return
        if payload.error is not None:
            rec.error = payload.error
            return
        obj = payload.obj
        if obj is None:
            return
        if obj.get("usage"):
            apply_usage(rec, obj["usage"])
        text = chunk_text(obj)
        if text is not None:
            if rec.chunks == 0:
                rec.ttft = now - rec.start
            else:
                rec.itls.append(now - self.last_token)
            self.last_token = now
            rec.chunks += 1
            rec.text += text
        for choice in obj.get("choices") or []:
            if choice.get("finish_reason"):
                rec.finish_reason = choice["finish_reason"]
                if rec.ttft is None:  # an empty answer (EOS first): its first token is EOS
                    rec.ttft = now - rec.start


async def stream_chat(session: aiohttp.ClientSession, url: str, body: dict[str, Any], *,
                      index: int = 0, meta: dict[str, Any] | None = None,
                      headers: dict[str, str] | None = None,
                      timeout_s: float = 600.0) -> RequestRecord:
    """POST ``body`` (with ``stream: true``) to ``url`` and time the stream. Never raises for
    a failed request: HTTP errors, error events, a stream cut before its finish chunk and
    ``[DONE]``, and timeouts are in ``error``."""
    rec = RequestRecord(index=index, meta=dict(meta or {}))
    rec.start = time.perf_counter()
    timer = StreamTimer(rec)
    try:
        async with asyncio.timeout(timeout_s), session.post(url, json=body,
                                                            headers=headers) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return rec
            decoder = SSEDecoder()
            async for raw in resp.content.iter_any():
                now = time.perf_counter()
                for data in decoder.feed(raw):
                    timer.event(data, now)
            for data in decoder.close():
                timer.event(data, time.perf_counter())
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        rec.e2e = time.perf_counter() - rec.start
    if rec.error is None:
        rec.error = timer.incomplete()
    if rec.output_tokens is None:
        rec.output_tokens = rec.chunks
    return rec
