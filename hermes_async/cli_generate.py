"""``hermes-async generate``: load a model, render one chat turn, stream a completion."""

from __future__ import annotations

import argparse
import sys
import time

from hermes_async import config as config_mod


def cmd_generate(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from hermes_async.model.default_model import resolve_model_path
    from hermes_async.model.generate import generate_ids
    from hermes_async.model.runner import ModelRunner

    cfg = config_mod.load(args.config) if args.config else config_mod.EngineConfig()
    overrides = {"dtype": args.dtype} if args.dtype else {}
    if args.model:
        overrides["path"] = args.model
    cfg = cfg.replace(model=overrides) if overrides else cfg
    if cfg.cache.kv_cache_bytes is None:
        cfg = cfg.replace(cache={"kv_cache_bytes": 64 << 20})
    model_dir = resolve_model_path(cfg.model.path)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    runner = ModelRunner(model_dir, cfg.model, cfg.cache)
    messages = [{"role": "user", "content": args.prompt}]
    prompt_ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                    tokenize=True, return_dict=False))
    stop = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    t0 = time.perf_counter()
    out: list[int] = []
    printed = ""
    for tok in generate_ids(runner, prompt_ids, args.max_tokens, stop, args.temperature,
                            args.seed):
        out.append(tok)
        text = tokenizer.decode(out, skip_special_tokens=True)
        if not text.endswith("\ufffd"):  # hold back an incomplete UTF-8 sequence
            sys.stdout.write(text[len(printed):])
            sys.stdout.flush()
            printed = text
    elapsed = time.perf_counter() - t0
    sys.stdout.write("\n")
    print(f"[{len(prompt_ids)} prompt tokens, {len(out)} new tokens in {elapsed:.2f} s, "
          f"{len(out) / max(elapsed, 1e-9):.1f} tok/s; model {model_dir}]", file=sys.stderr)
    return 0
