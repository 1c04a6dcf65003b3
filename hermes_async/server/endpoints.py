"""``GET /health``, ``GET /v1/models``, ``GET /metrics`` and ``POST /tokenize``."""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from hermes_async.server.auth import namespace_for
from hermes_async.server.errors import APIError, json_response
from hermes_async.server.limits import read_body
from hermes_async.server.openai_chat import assemble
from hermes_async.server.schemas import TokenizeRequest, decode
from hermes_async.server.state import STATE, TENANT


async def health(request: web.Request) -> web.Response:
    """200 ``{"status": "ok"}`` once the model is loaded and the engine runs; 503 (error
    object, ``code`` ``model_loading``/``model_load_failed``/``shutting_down``) otherwise."""
    request.app[STATE].engine_or_503()
    return json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    """The served model, OpenAI's list shape (plus vLLM's ``max_model_len`` and ``root``)."""
    state = request.app[STATE]
    engine = state.engine_or_503()
    root = str(engine.model_dir or state.config.model.path or state.model_name)
    return json_response({"object": "list", "data": [{
        "id": state.model_name, "object": "model", "created": state.created,
        "owned_by": "hermes_async", "root": root, "parent": None,
        "max_model_len": engine.max_model_len}]})


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition; queue and KV-pool gauges are refreshed at scrape time."""
    engine = request.app[STATE].engine
    m, core = engine.metrics, engine.core
    if core is not None:
        core.update_gauges()
    return web.Response(body=m.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def tokenize(request: web.Request) -> web.Response:
    """vLLM's ``/tokenize``: ``prompt`` (raw text, ``add_special_tokens``) or ``messages``
    (the chat template, ``add_generation_prompt``) -> ``{"tokens", "count",
    "max_model_len"}``; the ids are exactly what generation would use."""
    state = request.app[STATE]
    engine = state.engine_or_503()
    req = decode(await read_body(request, state.config.server.max_body_bytes), TokenizeRequest)
    state.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of prompt or messages", param="prompt",
                       code="invalid_value")
    if req.messages is not None:
        namespace = namespace_for(request[TENANT], None)
        prompt = await assemble(engine, req.messages, req.tools, req.add_generation_prompt,
                                namespace)
        tokens = list(prompt.token_ids)
    else:
        tokens = list(await asyncio.to_thread(engine.tokenizer.encode, req.prompt,
                                              add_special_tokens=req.add_special_tokens))
    return json_response({"tokens": tokens, "count": len(tokens),
                          "max_model_len": engine.max_model_len})
