"""``POST /v1/completions``: raw prompts (strings or token ids, one or several) -> engine.

A string prompt is tokenized by the engine's one raw-text rule (``AsyncEngine.encode_text``:
special tokens added unless ``add_special_tokens`` is false, as vLLM: a BOS where the model's
tokenizer adds one). Several prompts run as concurrent engine requests; choice ``k * n + i``
is sequence ``i`` of prompt ``k``. ``echo`` prepends the prompt text.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.engine.request import RequestOutput
from hermes_async.openai.format import ChunkFormatter, response_head, usage_dict
from hermes_async.openai.limits import Deadline, check_context
from hermes_async.openai.logprobs import CompletionLogprobs, TokenTexts
from hermes_async.openai.responses import JSONResponse, Response
from hermes_async.openai.schemas import (
    CompletionRequest,
    completion_prompts,
    completion_sampling_params,
    decode,
    structured_param,
)
from hermes_async.openai.service import service
from hermes_async.openai.state import RequestContext
from hermes_async.openai.stream import ChoiceResult, EngineStream, collect, logprobs_of
from hermes_async.openai.streaming import sse_response
from hermes_async.openai.structured import compile_constraint

log = logging.getLogger("hermes_async.openai")


def prompt_param(k: int, count: int) -> str:
    """How an error names prompt ``k`` of ``count``: ``prompt`` or ``prompt[k]``."""
    return "prompt" if count == 1 else f"prompt[{k}]"


def encode_prompts(engine: AsyncEngine, prompts: list[str | list[int]],
                   add_special_tokens: bool | None) -> list[list[int]]:
    """Token ids of each prompt; 400 for an empty prompt or an id outside the vocabulary."""
    out = []
    for k, p in enumerate(prompts):
        ids = engine.encode_text(p, add_special_tokens) if isinstance(p, str) else p
        out.append(engine.check_token_ids(ids, prompt_param(k, len(prompts))))
    return out


class CompletionChunks(ChunkFormatter):
    """Chunk formatter of one streamed completion."""

    def __init__(self, head: dict[str, Any], n: int, echo: list[str] | None,
                 texts: TokenTexts | None, include_usage: bool) -> None:
        super().__init__(head, include_usage)
        self.n, self.echo, self.texts = n, echo, texts
        self._logprobs: dict[int, CompletionLogprobs] = {}

    def _choice(self, index: int, text: str, logprobs: Any, finish: str | None) -> dict:
        return self.chunk({"index": index, "text": text, "logprobs": logprobs,
                           "finish_reason": finish})

    def prelude(self) -> list[dict[str, Any]]:
        if not self.echo:
            return []
        return [self._choice(k * self.n + i, text, None, None)
                for k, text in enumerate(self.echo) for i in range(self.n)]

    def on_output(self, prompt_index: int, out: RequestOutput) -> list[dict[str, Any]]:
        index = prompt_index * self.n + out.index
        chunks = []
        entries = logprobs_of(out) if self.texts is not None else ()
        if out.text or entries:
            lp = None
            if self.texts is not None:
                fmt = self._logprobs.setdefault(index, CompletionLogprobs(self.texts))
                lp = fmt.format(entries)
            chunks.append(self._choice(index, out.text, lp, None))
        if out.finish_reason is not None:
            chunks.append(self._choice(index, "", None, str(out.finish_reason)))
        return chunks


def completion_choice(c: ChoiceResult, n: int, echo: list[str] | None,
                      texts: TokenTexts | None) -> dict[str, Any]:
    """One choice of a non-streaming completion (the prompt first with ``echo``)."""
    prefix = echo[c.index // n] if echo else ""
    lp = CompletionLogprobs(texts).format(c.logprobs) if texts is not None else None
    return {"index": c.index, "text": prefix + "".join(c.text), "logprobs": lp,
            "finish_reason": c.finish_reason}


@service()
async def completions(ctx: RequestContext, body: bytes) -> Response:
    """A completion of each prompt of the JSON request ``body`` (``stream``: SSE chunks)."""
    state = ctx.state
    cfg = state.config.server
    engine = state.engine_or_503()
    req = decode(body, CompletionRequest)
    state.check_model(req.model)
    params = completion_sampling_params(req)
    prompts = completion_prompts(req.prompt)
    ids = await asyncio.to_thread(encode_prompts, engine, prompts, req.add_special_tokens)
    for k, p in enumerate(ids):
        check_context(prompt_param(k, len(ids)), len(p), params.max_tokens,
                      engine.max_model_len)
    echo = None
    if req.echo:
        echo = [p if isinstance(p, str) else engine.tokenizer.decode(p) for p in prompts]
    namespace = ctx.namespace(req.cache_salt)
    rid = f"cmpl-{uuid.uuid4().hex}"
    log.debug("%s: namespace=%s prompts=%d prompt_tokens=%s", rid, namespace, len(ids),
              [len(p) for p in ids])
    grammar = await compile_constraint(engine, params, structured_param(req))
    stream = await EngineStream.open(engine, ids, params, request_id=rid, namespace=namespace,
                               keepalive_s=cfg.keepalive_interval_s,
                               deadline=Deadline(cfg.request_timeout_s), grammar=grammar)
    head = response_head(rid, "text_completion", state.model_name)
    texts = TokenTexts(engine.tokenizer) if params.logprobs else None
    if req.stream:
        fmt = CompletionChunks(head, params.n, echo, texts, req.include_usage)
        return sse_response(stream, fmt, engine.metrics)
    try:
        choices = await collect(stream, params.n)
    finally:
        stream.close()
    return JSONResponse({**head, "choices": [completion_choice(c, params.n, echo, texts)
                                             for c in choices],
                         "usage": usage_dict(stream.usage)}, headers=stream.headers())
