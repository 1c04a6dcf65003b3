"""Tokenizers for the output-text tests.

- ``smol_tokenizer``: the default model's tokenizer (SmolLM2-135M-Instruct: byte-level BPE, the
  ChatML special tokens), loaded from the shared ``default_model_dir`` fixture.
- ``smol_tricky_ids``: SmolLM2 ids that stress incremental decoding: tokens holding only part of
  a multi-byte character (they decode to U+FFFD alone), the tokens of emoji and CJK text, and
  the special tokens.
- ``llama_tokenizer``: a tiny SentencePiece-style tokenizer built here with transformers' own
  ``LlamaTokenizer`` (BPE with byte fallback, Metaspace ``▁``, decoder Replace/ByteFallback/
  Fuse/Strip): the leading space of a ``▁word`` depends on the token before it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

TRICKY_TEXT = (
    "Hello, 世界! 你好吗？ 日本語のテキスト 한국어 🎉👍🏽🧑‍🚀 naïve café Ω≈ç√ "
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ✓ — “quotes” 🇫🇷 ... <|im_end|> done"
)

LLAMA_PIECES = [
    "▁", "▁▁", "▁H", "▁Hello", "Hello", "▁world", "world", "▁the", "the", "▁is", "▁Paris",
    "Paris", "中", "▁中", "文", ",", ".", "!", "a", "b", "▁a", "ab", "e", "H", "l", "o", "w",
    "r", "d", "He", "▁He", "ll", "llo", "\n",
]


@pytest.fixture(scope="session")
def smol_tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_dir))


@pytest.fixture(scope="session")
def smol_tricky_ids(smol_tokenizer: Any) -> list[int]:
    backend = smol_tokenizer.backend_tokenizer
    partial = [
        i for i in range(backend.get_vocab_size())
        if "\ufffd" in backend.decode([i], skip_special_tokens=False)
    ]
    assert len(partial) > 100  # byte-level BPE: many tokens end or start inside a character
    text_ids = smol_tokenizer.encode(TRICKY_TEXT, add_special_tokens=False)
    return sorted(set(partial) | set(text_ids) | set(smol_tokenizer.all_special_ids))


@pytest.fixture(scope="session")
def llama_tokenizer() -> Any:
    from transformers import LlamaTokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in LLAMA_PIECES:
        vocab.setdefault(piece, len(vocab))
    merges = [("▁", "H"), ("H", "e"), ("l", "l"), ("ll", "o"), ("▁H", "e"), ("▁He", "llo")]
    tok = LlamaTokenizer(vocab=vocab, merges=merges)
    assert tok.decode(tok.convert_tokens_to_ids(["▁world"])) == "world"  # stripped at start
    assert tok.decode(tok.convert_tokens_to_ids(["a", "▁world"])) == "a world"
    return tok
