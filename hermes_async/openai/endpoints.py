"""``GET /health``, ``GET /v1/models``, ``GET /metrics``, ``POST /tokenize`` and
``GET /openapi.json``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from prometheus_client import CONTENT_TYPE_LATEST

from hermes_async.openai.errors import APIError
from hermes_async.openai.openapi import openapi_document
from hermes_async.openai.responses import JSONResponse, RawResponse, Response
from hermes_async.openai.schemas import TokenizeRequest, decode
from hermes_async.openai.service import service
from hermes_async.openai.state import RequestContext


@service(count_errors=False)  # a probe: its 503s are not request errors
async def health(ctx: RequestContext, query: Mapping[str, str]) -> Response:
    """200 ``{"status": "ok"}`` once the model is loaded and the engine runs; 503 (error
    object, ``code`` ``model_loading``/``model_load_failed``/``shutting_down``) otherwise."""
    ctx.state.engine_or_503()
    return JSONResponse({"status": "ok"})


@service()
async def models(ctx: RequestContext, query: Mapping[str, str]) -> Response:
    """The served model, OpenAI's list shape (plus vLLM's ``max_model_len`` and ``root``)."""
    state = ctx.state
    engine = state.engine_or_503()
    root = str(engine.model_dir or state.config.model.path or state.model_name)
    return JSONResponse({"object": "list", "data": [{
        "id": state.model_name, "object": "model", "created": state.created,
        "owned_by": "hermes_async", "root": root, "parent": None,
        "max_model_len": engine.max_model_len}]})


@service()
async def metrics(ctx: RequestContext, query: Mapping[str, str]) -> Response:
    """Prometheus text exposition; queue and KV-pool gauges are refreshed at scrape time
    (answered while the model loads too)."""
    return RawResponse(await ctx.state.engine.report_metrics(), CONTENT_TYPE_LATEST)


@service()
async def tokenize(ctx: RequestContext, body: bytes) -> Response:
    """vLLM's ``/tokenize``: ``prompt`` (raw text, the engine's one rule, or
    ``add_special_tokens``) or ``messages`` (the chat template, ``add_generation_prompt``)
    -> ``{"tokens", "count", "max_model_len"}``; the ids are exactly what generation would
    use."""
    state = ctx.state
    engine = state.engine_or_503()
    req = decode(body, TokenizeRequest)
    state.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of prompt or messages", param="prompt",
                       code="invalid_value")
    if req.messages is not None:
        prompt = await engine.assemble(req.messages, req.tools,
                                       add_generation_prompt=req.add_generation_prompt,
                                       namespace=ctx.namespace())
        tokens = list(prompt.token_ids)
    else:
        text: str = req.prompt  # type: ignore[assignment]  # not None: checked above
        tokens = await asyncio.to_thread(engine.encode_text, text, req.add_special_tokens)
    return JSONResponse({"tokens": tokens, "count": len(tokens),
                         "max_model_len": engine.max_model_len})


@service(count_errors=False)
async def openapi(ctx: RequestContext, query: Mapping[str, str]) -> Response:
    """The OpenAPI 3.1 document of this API (:mod:`hermes_async.openai.openapi`)."""
    return JSONResponse(openapi_document(ctx.state.model_name))
