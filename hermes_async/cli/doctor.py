"""``hermes-async doctor FILE.jsonl``: the prompt doctor's command line.

Resolves the model directory, its tokenizer and the block size (the flag, the config, else the
model's shape), then hands plain values to :mod:`hermes_async.observe.doctor`.

Exit codes: 0 after a report (findings do not fail it), 2 on unreadable input (file, a malformed
line with its number, model directory, config).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``doctor`` to the top-level subparsers; it sets ``func=run``."""
    p = subparsers.add_parser(
        "doctor", help="diagnose prefix-cache reuse of captured requests (JSONL)",
        description="Offline report on captured requests: shared prefixes and what a block "
                    "cache would serve, dynamic fields that fork the prefix tree, prompts too "
                    "short to hit, and tool-role rendering, with advice for each finding.")
    p.add_argument("file", help="JSONL: one chat request body ('messages', optional 'tools') "
                                "or raw 'prompt' per line")
    p.add_argument("--model", help="local Hugging Face model or tokenizer directory "
                                   "(default: the config's, else the embedded default model)")
    p.add_argument("--config", help="TOML config file: model path and cache.block_size")
    p.add_argument("--block-size", type=int, help="tokens per KV block (default: the config's, "
                                                  "else derived from the model's shape)")
    p.add_argument("--template", help="PromptTemplate TOML file (configs/templates/) to use "
                                      "instead of the model's own chat template")
    p.add_argument("--namespace-key", help="group lines into cache namespaces by this field "
                                           "(e.g. 'user')")
    p.add_argument("--top", type=int, default=10, help="divergence points to show (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def resolve_block_size(model_dir: Path, block_size: int | None,
                       configured: int | None) -> tuple[int, str]:
    """``(block size, where it came from)``: the flag, the config, else the model's shape."""
    if block_size is not None:
        if block_size < 1:
            raise ValueError("--block-size must be at least 1")
        return block_size, "--block-size"
    if configured is not None:
        return configured, "config"
    from hermes_async.model.kv_pool import derive_block_size

    cfg_path = model_dir / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        heads = cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot derive the block size from {cfg_path} ({e}); "
                         "give --block-size") from e
    return derive_block_size(kv_heads, head_dim), f"derived: {kv_heads} KV heads x {head_dim}"


def run(args: argparse.Namespace) -> int:
    """Run ``hermes-async doctor``; returns the exit code (0 report, 2 unreadable input)."""
    from hermes_async import config as config_mod
    from hermes_async.model.default_model import resolve_model_path
    from hermes_async.model.tokenizer import load_tokenizer
    from hermes_async.observe.doctor import diagnose
    from hermes_async.observe.doctor_reader import DoctorInputError, PromptReader
    from hermes_async.observe.doctor_report import document, write_text
    from hermes_async.prompt import TemplateConfigError, load_prompt_template

    try:
        cfg = config_mod.load(args.config) if args.config else None
        model = args.model or (cfg.model.path if cfg else None)
        model_dir = resolve_model_path(model)
        tokenizer = load_tokenizer(model_dir)
        block_size, source = resolve_block_size(
            model_dir, args.block_size, cfg.cache.block_size if cfg else None)
        template = load_prompt_template(args.template) if args.template else None
        reader = PromptReader(tokenizer, template)
        prompts = reader.read(args.file, args.namespace_key)
    except DoctorInputError as e:
        print(f"hermes-async doctor: error: {args.file}: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError, RuntimeError, TemplateConfigError) as e:
        print(f"hermes-async doctor: error: {e}", file=sys.stderr)
        return 2
    report = diagnose(prompts, block_size=block_size, decode=tokenizer.decode,
                      top=max(args.top, 0), unknown_roles=reader.unknown_roles())
    doc = document(report, file=str(args.file), model=str(model_dir), block_size_source=source)
    if args.json:
        json.dump(doc, sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    else:
        write_text(doc, sys.stdout)
    return 0
