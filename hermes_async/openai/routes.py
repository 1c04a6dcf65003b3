"""The API's routes: method, path and service, the same for every front end.

A front end registers each :class:`Route`: for ``POST`` it reads the body (within
``server.max_body_bytes``) and calls ``service(ctx, body)``; for ``GET`` it calls
``service(ctx, query)``. :func:`counts_errors` says whether a failure on a path counts as a
request error (not for the ``/health`` probe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hermes_async.openai import cache_admin, endpoints
from hermes_async.openai.chat import chat_completions
from hermes_async.openai.completions import completions
from hermes_async.openai.service import Service

HEALTH_PATH = "/health"


@dataclass(frozen=True)
class Route:
    """One endpoint: ``GET`` services take the query, ``POST`` services the body."""

    method: Literal["GET", "POST"]
    path: str
    service: Service[Any]


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/chat/completions", chat_completions),
    Route("POST", "/v1/completions", completions),
    Route("GET", "/v1/models", endpoints.models),
    Route("POST", "/tokenize", endpoints.tokenize),
    Route("GET", HEALTH_PATH, endpoints.health),
    Route("GET", "/metrics", endpoints.metrics),
    Route("GET", "/cache/stats", cache_admin.cache_stats),
    Route("POST", "/cache/warm", cache_admin.cache_warm),
    Route("POST", "/cache/reset", cache_admin.cache_reset),
    Route("GET", "/openapi.json", endpoints.openapi),
)


def counts_errors(path: str) -> bool:
    """Whether failures on ``path`` count in ``hermes_request_errors_total``."""
    return path != HEALTH_PATH
