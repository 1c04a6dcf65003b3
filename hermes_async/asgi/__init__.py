"""OpenAI-compatible ASGI 3 front end: plain ASGI callables over :mod:`hermes_async.openai`
(no Starlette, no FastAPI, no aiohttp), for uvicorn or as the HTTP ingress of a Ray Serve
deployment.

    app = ASGIApp(ServiceState.of(config, engine))  # the lifespan scope starts/stops the engine
    app = create_app(config)                        # the same with hermes_async.AsyncEngine
    # uvicorn --factory hermes_async.asgi:create_app  (the embedded model)

Endpoints and behaviour are the aiohttp server's (:mod:`hermes_async.server`): the layer's
``ROUTES`` and ``GET /dashboard``, OpenAI error objects for 401/404/405/408/413, body size and
time limits, SSE streams whose client disconnect aborts the engine requests at once, sends
bounded by ``server.write_timeout_s``.

Modules: ``app`` (the app: lifespan, routing), ``messages`` (ASGI types and message helpers),
``body`` (the request body's limits), ``respond`` (a service's response -> ASGI messages,
the disconnect watch, the send clock), ``dashboard``.
"""

from hermes_async.asgi.app import ASGIApp, create_app

__all__ = ["ASGIApp", "create_app"]
