"""hermes_async: a hackable, pure-Python LLM inference server and embeddable engine.

One asyncio event loop owns a step scheduler with continuous batching over a paged KV pool
and a block-level prefix cache; see ``docs/architecture.md``.

    from hermes_async import AsyncEngine, EngineConfig, SamplingParams

    async with AsyncEngine(EngineConfig()) as engine:
        async for out in engine.generate(messages=[{"role": "user", "content": "Hi"}],
                                         params=SamplingParams(max_tokens=32)):
            print(out.text, end="", flush=True)
"""

from hermes_async.builder import AsyncEngine
from hermes_async.config import (
    CacheConfig,
    ConfigError,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
)
from hermes_async.engine.errors import EngineError, NamespaceBusyError, QueueFullError
from hermes_async.engine.request import RequestOutput, Usage
from hermes_async.types import FinishReason, InvalidParameter, SamplingParams

__version__ = "0.1.0"

__all__ = [
    "AsyncEngine",
    "CacheConfig",
    "ConfigError",
    "EngineConfig",
    "EngineError",
    "FinishReason",
    "InvalidParameter",
    "ModelConfig",
    "NamespaceBusyError",
    "QueueFullError",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
    "ServerConfig",
    "Usage",
    "__version__",
]
