"""Command line: ``hermes-async`` / ``python -m hermes_async``.

    hermes-async serve                  OpenAI-compatible HTTP server (prints its URL)
    hermes-async model fetch            convert the embedded default model once, print its dir
    hermes-async generate "question"    one-shot chat completion on the runner, streamed
    hermes-async render FILE.json       show the final prompt of a messages file
    hermes-async doctor FILE.jsonl      diagnose prefix-cache reuse of captured requests
    hermes-async kernels                the fast kernels this CPU admits (probed, cached)

One module per command, one pattern: ``register(subparsers)`` adds the command's parser and
sets ``func=run``; ``run(args) -> int`` is its exit status, and :func:`main` calls
``args.func(args)``. The command modules import only the standard library and light parts of
the package at the top; torch, transformers, aiohttp and the server are imported inside ``run``,
so ``hermes-async --help`` stays fast. This package is the top layer: nothing else in
``hermes_async`` imports it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from hermes_async.cli import doctor, generate, kernels, model, render, serve

COMMANDS = (model, generate, serve, render, doctor, kernels)  # the order of ``--help``


def build_parser() -> argparse.ArgumentParser:
    """The ``hermes-async`` parser with every command registered."""
    parser = argparse.ArgumentParser(prog="hermes-async", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the command; returns its exit status."""
    args = build_parser().parse_args(argv)
    return args.func(args)
