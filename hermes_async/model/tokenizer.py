"""The tokenizer of a model directory, as the server loads it.

A Hugging Face directory goes through ``AutoTokenizer`` (its family's tokenizer class). A GGUF's
prepared directory (:mod:`hermes_async.model.gguf.directory`) loads its ``tokenizer.json``
exactly as written: it was rebuilt from the file's own vocabulary and pre-tokenizer
(``tokenizer.ggml.pre``), which ``AutoTokenizer`` would replace with the family class's default
(Qwen2's regex for every ``qwen2`` GGUF, whatever the file says).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(model_dir: str | Path) -> Any:
    """The transformers tokenizer of ``model_dir`` (blocking: about a second)."""
    from hermes_async.model.gguf.directory import MANIFEST

    path = Path(model_dir)
    if (path / MANIFEST).is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(path))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
