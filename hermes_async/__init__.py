"""hermes_async: a hackable, pure-Python LLM inference server and embeddable engine.

One asyncio event loop owns a step scheduler with continuous batching over a paged KV pool
and a block-level prefix cache; see ``docs/architecture.md``.
"""

from hermes_async.config import CacheConfig, ConfigError, EngineConfig, ModelConfig

__version__ = "0.1.0"

__all__ = ["CacheConfig", "ConfigError", "EngineConfig", "ModelConfig", "__version__"]
