"""``hermes-async model fetch``: prepare the embedded default model once, print its directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``model fetch`` to the top-level subparsers; it sets ``func=run``."""
    model = subparsers.add_parser("model", help="manage the embedded default model")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    fetch = model_sub.add_parser("fetch", help="prepare SmolLM2-135M-Instruct once; print dir")
    fetch.add_argument("--home", default=None,
                       help="hermes cache root (default: $HERMES_HOME, else the XDG cache)")
    fetch.add_argument("--quiet", action="store_true", help="no progress output")
    fetch.set_defaults(func=run)
    convert = model_sub.add_parser(
        "convert", help="convert it into a float32 Hugging Face directory (other servers, tests)")
    convert.add_argument("--home", default=None,
                         help="hermes cache root (default: $HERMES_HOME, else the XDG cache)")
    convert.add_argument("--quiet", action="store_true", help="no progress output")
    convert.set_defaults(func=run_convert)


def _print_dir(args: argparse.Namespace, command: str, make: Any) -> int:
    """Print the directory ``make(home, progress=...)`` returns as the last stdout line; 0, or 1
    after printing a :class:`ModelFetchError` to stderr."""
    from hermes_async.model.default_model import ModelFetchError

    try:
        path = make(Path(args.home) if args.home else None, progress=not args.quiet)
    except ModelFetchError as exc:
        print(f"hermes-async model {command}: error: {exc}", file=sys.stderr)
        return 1
    print(path, flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
    """Prepare the default model (from its GGUF, once); print its directory as the last
    stdout line.

    ``args.home``: a hermes home overriding ``$HERMES_HOME`` (None: the default);
    ``args.quiet``: no progress on stderr. Returns 0, or 1 after printing the error to stderr.
    Never imports torch when the model is already prepared.
    """
    from hermes_async.model.default_model import prepare_default_model

    return _print_dir(args, "fetch", prepare_default_model)


def run_convert(args: argparse.Namespace) -> int:
    """Convert the default model into a float32 Hugging Face directory (once); print it."""
    from hermes_async.model.default_model import fetch_default_model

    return _print_dir(args, "convert", fetch_default_model)
