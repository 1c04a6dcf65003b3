"""The tokenizer of a GGUF, rebuilt from its vocabulary, merges and special tokens.

transformers' GGUF tokenizer builder does the work (by ``tokenizer.ggml.model`` and the
pre-tokenizer's regex by ``tokenizer.ggml.pre``); the one pre-tokenizer it does not know that a
supported family uses is SmolLM's (``smollm``: each digit its own pre-token, as in llama.cpp),
added here. Saved as ``PreTrainedTokenizerFast`` with the chat template inline (see
:mod:`hermes_async.model.gguf_convert`, which writes the same shape).
"""

from __future__ import annotations

from pathlib import Path

from hermes_async.model.spec import ModelLoadError

DIGIT_SPLIT_PRE = ("smollm",)


def save_tokenizer(gguf_path: Path, out: Path, max_len: int) -> dict[str, int]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` of ``gguf_path`` into ``out``;
    returns the vocabulary (text to id, added tokens included)."""
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    from hermes_async.model.gguf_convert import patch_tokenizer_config

    try:
        arch, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(gguf_path))
        backend, extra = convert_gguf_tokenizer(arch, tokenizer_dict)
    except (KeyError, ValueError) as e:
        raise ModelLoadError(f"{gguf_path}: cannot build its tokenizer: {e}") from e
    if tokenizer_dict.get("pre_tokenizer_type") in DIGIT_SPLIT_PRE:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    template = tokenizer_config.pop("chat_template", None)
    if not isinstance(template, str) or not template:
        raise ModelLoadError(f"{gguf_path}: no chat template (tokenizer.chat_template) in "
                             "the GGUF")
    specials = {k: v for k, v in tokenizer_config.items()
                if k.endswith("_token") and v is not None}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **specials, **extra)
    tokenizer.save_pretrained(str(out))
    patch_tokenizer_config(out, template, max_len)
    return dict(tokenizer.get_vocab())
