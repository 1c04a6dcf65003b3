"""``hermes-async serve``: flags over the config file over defaults; uvloop when installed.

Prints the URL as soon as it listens (``/health`` is 503 while the model loads), then a line
when the model is ready. SIGINT/SIGTERM shut down gracefully: new requests get 503, in-flight
ones get ``server.shutdown_drain_s`` to finish. Exit status 1 when the model fails to load.

``--replicas N`` (N >= 2), ``--ray`` or ``--ray-address`` serve the same API on Ray Serve
(:mod:`hermes_async.scale.app`: an ingress plus N engine replicas with prefix-cache-aware
routing); without the ``ray`` extra they say how to install it (exit status 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from hermes_async import config as config_mod
from hermes_async.config import DTYPE_CHOICES as DTYPES
from hermes_async.config import EngineConfig


def register(subparsers: Any) -> None:
    """Add ``serve`` to the top-level subparsers; it sets ``func=run``."""
    serve = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server; prints its URL")
    serve.add_argument("--model", default=None, help="HF directory (default: embedded model)")
    serve.add_argument("--config", default=None, help="TOML config file (configs/*.toml)")
    serve.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8000; 0: any)")
    serve.add_argument("--dtype", default=None, choices=DTYPES)
    serve.add_argument("--quantization", default=None, choices=config_mod.QUANTIZATIONS,
                       help="the linears' weights: none (as loaded), int8, int4 or int4-g128 "
                            "(model.quantization)")
    serve.add_argument("--activations", default=None, choices=config_mod.ACTIVATIONS,
                       help="int8: int8 / int4 linears' decode inputs quantized to int8 in "
                            "blocks of 32 (llama.cpp's Q8_0 / Q4 arithmetic; "
                            "model.activations)")
    serve.add_argument("--speculative", default=None, choices=config_mod.SPECULATIVE_METHODS,
                       help="ngram: decodes draft the tokens that followed an earlier "
                            "occurrence of their suffix, verified in the same step "
                            "([speculative] in the config)")
    serve.add_argument("--kv-cache-dir", default=None, metavar="DIR",
                       help="the prefix cache's disk tier: evicted KV blocks are written to DIR "
                            "and loaded back on a match, also after a restart "
                            "(cache.disk_dir; bounded by cache.disk_bytes)")
    serve.add_argument("--api-key", default=None, help="require this key (tenant 'default')")
    serve.add_argument("--replicas", type=int, default=None,
                       help="N >= 2 engine replicas behind one endpoint on Ray Serve (the "
                            "'ray' extra), prefix-cache-aware routing ([ray] in the config)")
    serve.add_argument("--ray", action="store_true",
                       help="serve on Ray Serve even with one replica")
    serve.add_argument("--ray-address", default=None,
                       help="join this Ray cluster (`ray start --head` prints it) instead of "
                            "starting a local one")
    serve.add_argument("--log-level", default="info",
                       choices=["debug", "info", "warning", "error"],
                       help="debug logs each request's start_position (prefix-cache hit)")
    serve.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> EngineConfig:
    """The effective config: ``--config`` file (or defaults), then the flags on top."""
    cfg = config_mod.load(args.config) if args.config else EngineConfig()
    model: dict[str, Any] = {}
    if args.model:
        model["path"] = args.model
    if args.dtype:
        model["dtype"] = args.dtype
    if getattr(args, "quantization", None):
        model["quantization"] = args.quantization
    if getattr(args, "activations", None):
        model["activations"] = args.activations
    server: dict[str, Any] = {}
    if args.host is not None:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    if args.api_key:
        from hermes_async.openai.auth import DEFAULT_TENANT

        server["api_keys"] = {**cfg.server.api_keys, args.api_key: DEFAULT_TENANT}
    ray: dict[str, Any] = {}
    if args.replicas is not None:
        if args.replicas < 1:
            raise config_mod.ConfigError("--replicas must be >= 1")
        ray["replicas"] = args.replicas
    if args.ray_address:
        ray["address"] = args.ray_address
    speculative: dict[str, Any] = {}
    if getattr(args, "speculative", None):
        speculative["method"] = args.speculative
    cache: dict[str, Any] = {}
    if getattr(args, "kv_cache_dir", None):
        cache["disk_dir"] = args.kv_cache_dir
    return cfg.replace(model=model, server=server, ray=ray, speculative=speculative,
                       cache=cache)


RAY_MISSING = ("hermes-async: --replicas/--ray/--ray-address serve on Ray Serve, which is not "
               "installed; install the extra: pip install 'hermes_async[ray]' (in this "
               "checkout: .venv/bin/pip install -e '.[ray]')")


def wants_ray(args: argparse.Namespace) -> bool:
    """``--ray``, ``--ray-address`` or ``--replicas`` N >= 2."""
    return bool(args.ray or args.ray_address or (args.replicas or 1) >= 2)


def serve_on_ray(cfg: EngineConfig) -> int:
    """``hermes-async serve`` on Ray Serve: an ingress and ``ray.replicas`` engines."""
    try:
        from hermes_async.scale.app import serve_forever
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] != "ray":
            raise
        print(RAY_MISSING, file=sys.stderr)
        return 2
    return serve_forever(cfg)


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive after start-up (the model's modules, the
    tokenizer, the imported modules) out of the collector's reach (``gc.freeze``): a full
    collection under load then walks only what requests allocate (about 170 ms a full
    collection of the loaded server, twice in its first loaded seconds, each holding the
    GIL from the step). Returns the frozen objects' count."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def run_event_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def serve(cfg: EngineConfig) -> int:
    """Listen, load, serve until SIGINT/SIGTERM; returns the exit status."""
    from hermes_async.server.app import create_app, start_site, wait_until_ready
    from hermes_async.server.state import STATE

    app = create_app(cfg)
    runner, url = await start_site(app, cfg.server.host, cfg.server.port)
    print(f"hermes-async: listening on {url} (loading the model...)", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    status = 0
    try:
        ready = asyncio.ensure_future(wait_until_ready(app))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([ready, stopped], return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            if ready.exception() is not None:
                print(f"hermes-async: the model failed to load: {ready.exception()}",
                      file=sys.stderr, flush=True)
                status = 1
            else:
                state = app[STATE]
                freeze_startup_heap()
                print(f"hermes-async: ready: model {state.model_name!r} "
                      f"(max_model_len {state.engine.max_model_len}); OpenAI base URL "
                      f"{url}/v1", flush=True)
                await stopped
        ready.cancel()  # the engine's start itself goes on; cleanup waits for it
        stopped.cancel()
    finally:
        print("hermes-async: shutting down", flush=True)
        await runner.cleanup()
    return status


def run(args: argparse.Namespace) -> int:
    """Entry point of ``hermes-async serve``."""
    try:
        cfg = build_config(args)
    except config_mod.ConfigError as e:
        print(f"hermes-async: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if wants_ray(args):
        return serve_on_ray(cfg)
    try:
        return run_event_loop(serve(cfg))
    except OSError as e:  # e.g. the address is in use
        print(f"hermes-async: cannot listen on {cfg.server.host}:{cfg.server.port}: {e}",
              file=sys.stderr)
        return 1
