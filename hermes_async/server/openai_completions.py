"""``POST /v1/completions``: raw prompts (strings or token ids, one or several) -> engine.

A string prompt is tokenized with ``add_special_tokens`` (default true, as vLLM: a BOS where
the model's tokenizer adds one). Several prompts run as concurrent engine requests; choice
``k * n + i`` is sequence ``i`` of prompt ``k``. ``echo`` prepends the prompt text.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from aiohttp import web

from hermes_async.engine.request import RequestOutput
from hermes_async.server.auth import namespace_for
from hermes_async.server.errors import APIError, json_response
from hermes_async.server.generation import EngineStream, collect, logprobs_of, usage_dict
from hermes_async.server.limits import Deadline, check_context, read_body
from hermes_async.server.logprobs import CompletionLogprobs, TokenTexts
from hermes_async.server.openai_chat import SYSTEM_FINGERPRINT
from hermes_async.server.schemas import (
    CompletionRequest,
    completion_prompts,
    completion_sampling_params,
    decode,
)
from hermes_async.server.state import STATE, TENANT
from hermes_async.server.streaming import ChunkFormatter, serve_stream

log = logging.getLogger("hermes_async.server")


def encode_prompts(tokenizer: Any, prompts: list[str | list[int]],
                   add_special_tokens: bool) -> list[list[int]]:
    """Token ids of each prompt; 400 for an empty prompt or an id outside the vocabulary."""
    vocab = len(tokenizer) if hasattr(tokenizer, "__len__") else None
    out = []
    for k, p in enumerate(prompts):
        param = "prompt" if len(prompts) == 1 else f"prompt[{k}]"
        ids = (list(tokenizer.encode(p, add_special_tokens=add_special_tokens))
               if isinstance(p, str) else p)
        if not ids:
            raise APIError(400, "the prompt is empty", param=param, code="invalid_value")
        if vocab is not None and not all(0 <= t < vocab for t in ids):
            raise APIError(400, f"token ids must be in [0, {vocab})", param=param,
                           code="invalid_value")
        out.append(ids)
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


async def completions(request: web.Request) -> web.StreamResponse:
    """The handler; every failure raises (the error middleware answers it)."""
    state = request.app[STATE]
    cfg = state.config.server
    engine = state.engine_or_503()
    req = decode(await read_body(request, cfg.max_body_bytes), CompletionRequest)
    state.check_model(req.model)
    params = completion_sampling_params(req)
    prompts = completion_prompts(req.prompt)
    ids = await asyncio.to_thread(encode_prompts, engine.tokenizer, prompts,
                                  req.add_special_tokens)
    for k, p in enumerate(ids):
        check_context("prompt" if len(ids) == 1 else f"prompt[{k}]", len(p), params.max_tokens,
                      engine.max_model_len)
    echo = None
    if req.echo:
        echo = [p if isinstance(p, str) else engine.tokenizer.decode(p) for p in prompts]
    namespace = namespace_for(request[TENANT], req.cache_salt)
    rid = f"cmpl-{uuid.uuid4().hex}"
    log.debug("%s: namespace=%s prompts=%d prompt_tokens=%s", rid, namespace, len(ids),
              [len(p) for p in ids])
    stream = EngineStream.open(engine, ids, params, request_id=rid, namespace=namespace,
                               keepalive_s=cfg.keepalive_interval_s,
                               deadline=Deadline(cfg.request_timeout_s))
    head = {"id": rid, "object": "text_completion", "created": int(time.time()),
            "model": state.model_name, "system_fingerprint": SYSTEM_FINGERPRINT}
    texts = TokenTexts(engine.tokenizer) if params.logprobs else None
    if req.stream:
        fmt = CompletionChunks(head, params.n, echo, texts, req.include_usage)
        return await serve_stream(request, stream, fmt, engine.metrics)
    try:
        choices = await collect(stream, params.n)
    finally:
        stream.close()
    out = []
    for c in choices:
        prefix = echo[c.index // params.n] if echo else ""
        lp = CompletionLogprobs(texts).format(c.logprobs) if texts is not None else None
        out.append({"index": c.index, "text": prefix + "".join(c.text), "logprobs": lp,
                    "finish_reason": c.finish_reason})
    return json_response({**head, "choices": out, "usage": usage_dict(stream.usage)})
