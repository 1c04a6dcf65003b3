"""``Ingress``: the HTTP front of a Ray Serve deployment of hermes_async.

One ASGI app (:class:`~hermes_async.asgi.ASGIApp`: the same routes, request and error shapes
as the single-process server, through the framework-neutral OpenAI layer) over a
:class:`~hermes_async.scale.remote_engine.RemoteEngine` whose handle reaches the engine
replicas. Ray Serve's proxy passes it every HTTP request; ``__del__`` (shutdown, downscale)
drains its streams for ``server.shutdown_drain_s``.
"""

from __future__ import annotations

from typing import Any

from ray import serve

from hermes_async.asgi import ASGIApp
from hermes_async.config import EngineConfig
from hermes_async.openai.state import ServiceState
from hermes_async.scale.remote_engine import RemoteEngine


@serve.ingress()
class Ingress:
    """The ingress deployment's class (``serve.deployment`` is applied by ``build_app``)."""

    async def __init__(self, config: EngineConfig, engine: Any) -> None:
        self.remote = RemoteEngine(config, engine)
        self.state = ServiceState.of(config, self.remote)
        self.state.start()  # prompt side + first replica answer, in the background

    def __serve_build_asgi_app__(self) -> ASGIApp:
        return ASGIApp(self.state, manage_lifecycle=False)

    async def check_health(self) -> None:
        """Healthy unless the start failed (a load error restarts the ingress)."""
        error = self.state.load_error()
        if error is not None:
            raise RuntimeError(f"the ingress failed to start: {error}")

    async def __del__(self) -> None:
        self.state.begin_shutdown()
        await self.state.stop()
