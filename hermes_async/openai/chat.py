"""``POST /v1/chat/completions``: messages -> the engine's prompt assembly (cached) -> engine.

Streaming sends, per choice, a first chunk with ``delta.role``, then ``delta.content`` chunks
(and, when tools are parsed, ``delta.tool_calls``: see :mod:`hermes_async.openai.tool_calls`),
then a chunk with an empty delta and the ``finish_reason``; with
``stream_options.include_usage`` every chunk has ``"usage": null`` and one last chunk with no
choices carries the usage.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

from hermes_async.engine.request import RequestOutput
from hermes_async.openai.errors import APIError
from hermes_async.openai.format import ChunkFormatter, response_head, usage_dict
from hermes_async.openai.limits import Deadline, check_context
from hermes_async.openai.logprobs import TokenTexts, chat_logprobs
from hermes_async.openai.responses import JSONResponse, Response
from hermes_async.openai.schemas import (
    ChatCompletionRequest,
    chat_sampling_params,
    decode,
    structured_param,
)
from hermes_async.openai.service import service
from hermes_async.openai.state import RequestContext
from hermes_async.openai.stream import ChoiceResult, EngineStream, collect, logprobs_of
from hermes_async.openai.streaming import sse_response
from hermes_async.openai.structured import compile_constraint
from hermes_async.openai.tool_calls import (
    ToolDeltas,
    finish_reason_of,
    forced_calls,
    message_of,
    tool_choice_of,
)
from hermes_async.tools import ParsedOutput, ToolCallParser

log = logging.getLogger("hermes_async.openai")


class ChatChunks(ChunkFormatter):
    """Chunk formatter of one streamed chat completion; with ``parser``, each choice's text
    goes through its tool-call stream first."""

    def __init__(self, head: dict[str, Any], n: int, texts: TokenTexts | None,
                 include_usage: bool, parser: ToolCallParser | None = None) -> None:
        super().__init__(head, include_usage)
        self.n, self.texts = n, texts
        self.tools = None if parser is None else [ToolDeltas(parser) for _ in range(n)]

    def prelude(self) -> list[dict[str, Any]]:
        return [self.chunk({"index": i, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None}) for i in range(self.n)]

    def on_output(self, prompt_index: int, out: RequestOutput) -> list[dict[str, Any]]:
        chunks = []
        entries = logprobs_of(out) if self.texts is not None else ()
        lp = chat_logprobs(entries, self.texts) if self.texts is not None and entries else None
        reason = None if out.finish_reason is None else str(out.finish_reason)
        if self.tools is None:
            deltas = [{"content": out.text}] if out.text or entries else []
        else:
            tools = self.tools[out.index]
            deltas = tools.feed(out.text) + (tools.finish() if reason is not None else [])
            if reason is not None:
                reason = finish_reason_of(reason, tools.has_calls)
        for j, delta in enumerate(deltas):
            chunks.append(self.chunk({"index": out.index, "delta": delta,
                                      "logprobs": lp if j == 0 else None,
                                      "finish_reason": None}))
        if not deltas and lp is not None:  # held-back text: still send the logprobs
            chunks.append(self.chunk({"index": out.index, "delta": {}, "logprobs": lp,
                                      "finish_reason": None}))
        if reason is not None:
            chunks.append(self.chunk({"index": out.index, "delta": {}, "logprobs": None,
                                      "finish_reason": reason}))
        return chunks


def chat_choice(c: ChoiceResult, texts: TokenTexts | None,
                parser: ToolCallParser | None = None) -> dict[str, Any]:
    """One choice of a non-streaming chat completion (tool calls parsed with ``parser``)."""
    text = "".join(c.text)
    parsed = parser.parse(text) if parser is not None else ParsedOutput(text, ())
    return {"index": c.index, "message": message_of(parsed),
            "logprobs": chat_logprobs(c.logprobs, texts) if texts is not None else None,
            "finish_reason": finish_reason_of(c.finish_reason, bool(parsed.tool_calls))}


@service()
async def chat_completions(ctx: RequestContext, body: bytes) -> Response:
    """A chat completion (``stream``: SSE chunks) of the JSON request ``body``."""
    state = ctx.state
    cfg = state.config.server
    engine = state.engine_or_503()
    req = decode(body, ChatCompletionRequest)
    state.check_model(req.model)
    params = chat_sampling_params(req)
    tool_choice = tool_choice_of(req.tools, req.tool_choice)
    parser = engine.tool_parser() if req.tools and tool_choice != "none" else None
    constraint_param = structured_param(req)
    forced = (None if parser is None
              else forced_calls(parser, req.tools, tool_choice, req.parallel_tool_calls))
    if forced is not None:
        if params.structured is not None:
            raise APIError(400, f"tool_choice {tool_choice!r} cannot be combined with "
                           f"{constraint_param}", param="tool_choice", code="invalid_value")
        params, constraint_param = dataclasses.replace(params, structured=forced), "tools"
    namespace = ctx.namespace(req.cache_salt)
    prompt = await engine.assemble(req.messages, req.tools, tool_choice=tool_choice,
                                   add_generation_prompt=req.add_generation_prompt,
                                   namespace=namespace)
    check_context("messages", len(prompt.token_ids), params.max_tokens, engine.max_model_len)
    grammar = await compile_constraint(engine, params, constraint_param)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    log.debug("%s: namespace=%s prompt_tokens=%d assembly=%s", rid, namespace,
              len(prompt.token_ids), prompt.cache_outcome)
    stream = await EngineStream.open(engine, [prompt.token_ids], params, request_id=rid,
                               namespace=namespace, keepalive_s=cfg.keepalive_interval_s,
                               deadline=Deadline(cfg.request_timeout_s), grammar=grammar)
    head = response_head(rid, "chat.completion.chunk" if req.stream else "chat.completion",
                         state.model_name)
    texts = TokenTexts(engine.tokenizer) if params.logprobs else None
    if req.stream:
        return sse_response(stream, ChatChunks(head, params.n, texts, req.include_usage,
                                               parser), engine.metrics)
    try:
        choices = await collect(stream, params.n)
    finally:
        stream.close()
    return JSONResponse({**head, "choices": [chat_choice(c, texts, parser) for c in choices],
                         "usage": usage_dict(stream.usage)}, headers=stream.headers())
