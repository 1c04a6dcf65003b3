"""``POST /v1/chat/completions``: messages -> prompt assembly (server side, cached) -> engine.

Streaming sends, per choice, a first chunk with ``delta.role``, then ``delta.content`` chunks,
then a chunk with an empty delta and the ``finish_reason``; with
``stream_options.include_usage`` every chunk has ``"usage": null`` and one last chunk with no
choices carries the usage.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from aiohttp import web

from hermes_async import __version__
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.engine.request import RequestOutput
from hermes_async.server.auth import namespace_for
from hermes_async.server.errors import APIError, json_response
from hermes_async.server.generation import EngineStream, collect, logprobs_of, usage_dict
from hermes_async.server.limits import Deadline, check_context, read_body
from hermes_async.server.logprobs import TokenTexts, chat_logprobs
from hermes_async.server.schemas import ChatCompletionRequest, chat_sampling_params, decode
from hermes_async.server.state import STATE, TENANT
from hermes_async.server.streaming import ChunkFormatter, serve_stream

log = logging.getLogger("hermes_async.server")

SYSTEM_FINGERPRINT = f"hermes-async-{__version__}"


async def assemble(engine: AsyncEngine, messages: list[Any], tools: list[Any] | None,
                   add_generation_prompt: bool, namespace: str) -> Any:
    """Assemble a prompt off the loop (``PromptError`` -> 400) and count the assembly-cache
    outcome under ``namespace``; returns the ``AssembledPrompt``."""
    if engine.assembler is None:
        raise APIError(400, "this engine has no chat template; use /v1/completions",
                       param="messages", code="no_chat_template")
    prompt = await asyncio.to_thread(engine.assembler.assemble, messages, tools or None,
                                     add_generation_prompt)
    m = engine.metrics
    m.assembly_queries.labels(namespace).inc()
    hits, partial = m.assembly_hits.labels(namespace), m.assembly_partial_hits.labels(namespace)
    if prompt.cache_outcome == "hit":  # (both series exist, at 0, from a namespace's first query)
        hits.inc()
    elif prompt.cache_outcome == "partial":
        partial.inc()
    if engine.observer is not None:
        engine.observer.on_assembly(namespace, prompt.cache_outcome)
    return prompt


class ChatChunks(ChunkFormatter):
    """Chunk formatter of one streamed chat completion."""

    def __init__(self, head: dict[str, Any], n: int, texts: TokenTexts | None,
                 include_usage: bool) -> None:
        super().__init__(head, include_usage)
        self.n, self.texts = n, texts

    def prelude(self) -> list[dict[str, Any]]:
        return [self.chunk({"index": i, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None}) for i in range(self.n)]

    def on_output(self, prompt_index: int, out: RequestOutput) -> list[dict[str, Any]]:
        chunks = []
        entries = logprobs_of(out) if self.texts is not None else ()
        if out.text or entries:
            lp = chat_logprobs(entries, self.texts) if self.texts is not None else None
            chunks.append(self.chunk({"index": out.index, "delta": {"content": out.text},
                                      "logprobs": lp, "finish_reason": None}))
        if out.finish_reason is not None:
            chunks.append(self.chunk({"index": out.index, "delta": {}, "logprobs": None,
                                      "finish_reason": str(out.finish_reason)}))
        return chunks


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """The handler; every failure raises (the error middleware answers it)."""
    state = request.app[STATE]
    cfg = state.config.server
    engine = state.engine_or_503()
    req = decode(await read_body(request, cfg.max_body_bytes), ChatCompletionRequest)
    state.check_model(req.model)
    params = chat_sampling_params(req)
    namespace = namespace_for(request[TENANT], req.cache_salt)
    prompt = await assemble(engine, req.messages, req.tools, req.add_generation_prompt,
                            namespace)
    check_context("messages", len(prompt.token_ids), params.max_tokens, engine.max_model_len)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    log.debug("%s: namespace=%s prompt_tokens=%d assembly=%s", rid, namespace,
              len(prompt.token_ids), prompt.cache_outcome)
    stream = EngineStream.open(engine, [prompt.token_ids], params, request_id=rid,
                               namespace=namespace, keepalive_s=cfg.keepalive_interval_s,
                               deadline=Deadline(cfg.request_timeout_s))
    head = {"id": rid, "object": "chat.completion.chunk" if req.stream else "chat.completion",
            "created": int(time.time()), "model": state.model_name,
            "system_fingerprint": SYSTEM_FINGERPRINT}
    texts = TokenTexts(engine.tokenizer) if params.logprobs else None
    if req.stream:
        fmt = ChatChunks(head, params.n, texts, req.include_usage)
        return await serve_stream(request, stream, fmt, engine.metrics)
    try:
        choices = await collect(stream, params.n)
    finally:
        stream.close()
    body = {**head, "choices": [
        {"index": c.index,
         "message": {"role": "assistant", "content": "".join(c.text), "refusal": None},
         "logprobs": chat_logprobs(c.logprobs, texts) if texts is not None else None,
         "finish_reason": c.finish_reason} for c in choices],
        "usage": usage_dict(stream.usage)}
    return json_response(body)
