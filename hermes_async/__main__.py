"""Command line: ``hermes-async`` / ``python -m hermes_async``.

    hermes-async serve                  OpenAI-compatible HTTP server (prints its URL)
    hermes-async model fetch            convert the embedded default model once, print its dir
    hermes-async generate "question"    one-shot chat completion on the runner, streamed
    hermes-async render FILE.json       show the final prompt of a messages file
    hermes-async doctor FILE.jsonl      diagnose prefix-cache reuse of captured requests
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hermes-async", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="manage the embedded default model")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    fetch = model_sub.add_parser("fetch", help="convert SmolLM2-135M-Instruct once; print dir")
    fetch.add_argument("--quiet", action="store_true", help="no progress output")

    gen = sub.add_parser("generate", help="one-shot chat completion, streamed to stdout")
    gen.add_argument("prompt", nargs="?", default="What is the capital of France?")
    gen.add_argument("--model", default=None, help="HF directory (default: embedded model)")
    gen.add_argument("--config", default=None, help="TOML config file")
    gen.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server; prints its URL")
    serve.add_argument("--model", default=None, help="HF directory (default: embedded model)")
    serve.add_argument("--config", default=None, help="TOML config file (configs/*.toml)")
    serve.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8000; 0: any)")
    serve.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    serve.add_argument("--api-key", default=None, help="require this key (tenant 'default')")
    serve.add_argument("--log-level", default="info",
                       choices=["debug", "info", "warning", "error"],
                       help="debug logs each request's start_position (prefix-cache hit)")

    try:
        from hermes_async.cli_render import add_render_parser
    except ImportError:  # prompt assembly not installed in this build
        pass
    else:
        add_render_parser(sub)
    try:
        from hermes_async.observe.doctor_cli import add_doctor_parser
    except ImportError:  # observability not installed in this build
        pass
    else:
        add_doctor_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "model":
        from hermes_async.cli_model import cmd_model_fetch

        return cmd_model_fetch(args)
    if args.command == "generate":
        from hermes_async.cli_generate import cmd_generate

        return cmd_generate(args)
    if args.command == "serve":
        from hermes_async.server.cli import cmd_serve

        return cmd_serve(args)
    if args.command == "render":
        from hermes_async.cli_render import cmd_render

        return cmd_render(args)
    if args.command == "doctor":
        from hermes_async.observe.doctor_cli import cmd_doctor

        return cmd_doctor(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
