"""Convert a Llama-family GGUF into a standard Hugging Face directory, with transformers.

transformers reads the GGUF (``from_pretrained(dir, gguf_file=name)``, which needs ``gguf`` and
``accelerate``) and dequantizes every tensor to float, but refuses ``save_pretrained`` on the
model it loaded that way. So the state dict is copied into a fresh ``LlamaForCausalLM`` built
from the same config without its ``quantization_config`` and saved from there.

Weights are written in **float32**: the dequantized Q4_1/Q8_0 values are exact in float32, so
tests (and anyone else) can compare the saved tensors with ``gguf``'s dequantization bit for
bit; bfloat16 would round them. Loaders cast to bfloat16 at load time when asked.

The directory is made loadable by older transformers 4.x and by other servers (see
:func:`_patch_config` and :func:`_patch_tokenizer_config`):

* ``config.json`` gets ``rope_theta`` beside ``rope_parameters`` and ``torch_dtype`` beside
  ``dtype``;
* ``tokenizer_config.json`` carries the chat template itself (transformers 5 would put it in
  ``chat_template.jinja``, which 4.x before 4.43 does not read) and
  ``tokenizer_class = "PreTrainedTokenizerFast"``: both 4.x and 5.x then load ``tokenizer.json``
  exactly as written. With ``"GPT2Tokenizer"`` (the name the upstream repository uses),
  transformers 5 rebuilds the pre-tokenizer from the class and silently drops the digit split
  below, which changes the token ids of text with digits after whitespace.
* transformers' GGUF tokenizer converter ignores ``tokenizer.ggml.pre``; for ``smollm`` (as in
  llama.cpp and the upstream ``tokenizer.json``) each digit is its own pre-token, so the
  converter puts ``Digits(individual_digits=True)`` in front of the byte-level step.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from pathlib import Path
from typing import Any

CONVERTER_VERSION = 1
"""Bump when the output changes: directories with an older manifest are converted again."""

TOKENIZER_CLASS = "PreTrainedTokenizerFast"
_DIGIT_SPLIT_PRE = ("smollm",)
_PROBES = ("In 2024, 12345 apples\n\n  cost $3.50.", "<|im_start|>user\nhi<|im_end|>\n")


def _gguf_metadata(path: Path, key: str) -> Any:
    """One metadata value of a GGUF file, or ``None`` when absent."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get(key)
    return None if field is None else field.contents()


def _patch_json(path: Path, update: dict[str, Any], drop: tuple[str, ...] = ()) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    for key in drop:
        data.pop(key, None)
    data.update(update)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _patch_config(out_dir: Path) -> None:
    """Legacy keys for transformers 4.x / other servers, next to the transformers 5 ones."""
    path = out_dir / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    update: dict[str, Any] = {"torch_dtype": cfg.get("dtype", "float32")}
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" in rope:
        update["rope_theta"] = rope["rope_theta"]
    _patch_json(path, update, drop=("quantization_config", "_model_name_or_path"))


def patch_tokenizer_config(out_dir: Path, chat_template: str, max_len: int) -> None:
    """Concrete class, chat template inline, decode settings pinned (see the module doc)."""
    _patch_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": TOKENIZER_CLASS,
            "chat_template": chat_template,
            "add_bos_token": False,
            "add_eos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": max_len,
        },
        drop=("is_local", "local_files_only", "name_or_path", "backend"),
    )
    jinja = out_dir / "chat_template.jinja"
    if jinja.exists():  # one copy only, in tokenizer_config.json, which every version reads
        jinja.unlink()


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path, progress: bool = True) -> None:
    """Write config, float32 safetensors weights, tokenizer and generation config to ``out_dir``.

    ``out_dir`` must exist and be empty; on error it is left partly written (the caller owns
    it and deletes it). Raises ``ValueError`` for a GGUF that is not of the Llama family.
    """
    import torch
    import transformers
    from tokenizers import pre_tokenizers
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        LlamaForCausalLM,
    )

    bars_were_on = transformers.utils.logging.is_progress_bar_enabled()
    # The GGUF dequantization bar ignores disable_progress_bar(): silence that module's tqdm
    # for the duration of the conversion when asked to be quiet.
    gguf_utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    if not progress:
        transformers.utils.logging.disable_progress_bar()
        if gguf_tqdm is not None:
            gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        src_dir, name = str(gguf_path.parent), gguf_path.name
        gguf_config = AutoConfig.from_pretrained(src_dir, gguf_file=name)
        if gguf_config.model_type != "llama":
            raise ValueError(f"{gguf_path}: architecture {gguf_config.model_type!r} is not llama")
        tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
        if _gguf_metadata(gguf_path, "tokenizer.ggml.pre") in _DIGIT_SPLIT_PRE:
            tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ])
        if progress:
            print("hermes: dequantizing the GGUF tensors to float32", file=sys.stderr, flush=True)
        loaded = AutoModelForCausalLM.from_pretrained(  # config= saves one more GGUF parse
            src_dir, gguf_file=name, config=gguf_config, dtype=torch.float32
        )
        state = loaded.state_dict()

        config_dict = loaded.config.to_dict()
        for key in ("quantization_config", "_model_name_or_path", "_name_or_path"):
            config_dict.pop(key, None)
        config = type(loaded.config).from_dict(config_dict)
        del loaded
        model = LlamaForCausalLM(config).to(torch.float32)
        model.load_state_dict(state, strict=True)
        del state
        model.eval()

        eos_ids = [config.eos_token_id]
        end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        if isinstance(end_of_text, int) and end_of_text not in eos_ids:
            eos_ids.append(end_of_text)  # <|im_end|> ends a chat turn, <|endoftext|> a document
        model.generation_config = GenerationConfig(
            bos_token_id=config.bos_token_id,
            eos_token_id=eos_ids,
            pad_token_id=config.pad_token_id,
        )
        if progress:
            print(f"hermes: writing float32 safetensors to {out_dir}", file=sys.stderr, flush=True)
        model.save_pretrained(out_dir, safe_serialization=True)
        del model
        tokenizer.save_pretrained(out_dir)
        template = tokenizer.chat_template
        if not isinstance(template, str) or not template:
            raise ValueError(f"{gguf_path}: no chat template (tokenizer.chat_template) in the GGUF")
        _patch_config(out_dir)
        patch_tokenizer_config(out_dir, template, config.max_position_embeddings)

        reloaded = AutoTokenizer.from_pretrained(str(out_dir))  # cheap self-check
        for text in _PROBES:
            if reloaded(text).input_ids != tokenizer(text).input_ids:
                raise ValueError(f"{out_dir}: the saved tokenizer encodes {text!r} differently")
    finally:
        if bars_were_on:
            transformers.utils.logging.enable_progress_bar()
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
