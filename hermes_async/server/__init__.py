"""OpenAI-compatible HTTP server (aiohttp) over :class:`~hermes_async.engine.AsyncEngine`.

``create_app(config)`` builds the app (the engine lives in its ``cleanup_ctx``);
``start_site(app, host, port)`` listens with handler cancellation on; ``hermes-async serve``
does both from the command line. Endpoints: ``POST /v1/chat/completions``,
``POST /v1/completions`` (SSE with ``stream: true``), ``GET /v1/models``, ``POST /tokenize``,
``GET /health``, ``GET /metrics``.
"""

from hermes_async.server.app import create_app, start_site, wait_until_ready
from hermes_async.server.state import STATE, ServerState

__all__ = ["STATE", "ServerState", "create_app", "start_site", "wait_until_ready"]
