"""OpenAI-compatible HTTP server (aiohttp): thin adapters over :mod:`hermes_async.openai`.

``create_app(config)`` builds the app (the engine lives in its ``cleanup_ctx``);
``start_site(app, host, port)`` listens with handler cancellation on; ``hermes-async serve``
(``hermes_async.cli.serve``) does both from the command line. Endpoints: the layer's
``ROUTES`` -- ``POST /v1/chat/completions``, ``POST /v1/completions`` (SSE with
``stream: true``), ``GET /v1/models``, ``POST /tokenize``, ``GET /health``, ``GET /metrics``,
``GET /cache/stats``, ``POST /cache/warm``, ``POST /cache/reset`` -- and ``GET /dashboard``.

Modules: ``app`` (the app, listening), ``state`` (typed app/request keys), ``auth`` and
``errors`` (the two middlewares), ``handlers`` (request -> service), ``body`` (the body's
size and time limits), ``respond`` (a service's response -> aiohttp, SSE included, each write
bounded by ``server.write_timeout_s`` against clients that stop reading), ``head`` (request-
head limits: 431/414), ``dashboard``, ``background`` (:class:`BackgroundServer`: the app from
a thread with its own loop, for tests, soaks and synchronous programs).
"""

from hermes_async.server.app import create_app, runner_options, start_site, wait_until_ready
from hermes_async.server.background import BackgroundServer
from hermes_async.server.state import STATE

__all__ = ["STATE", "BackgroundServer", "create_app", "runner_options", "start_site",
           "wait_until_ready"]
