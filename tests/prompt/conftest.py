"""Tokenizers for the prompt tests.

- ``smol_tokenizer``: the default model's tokenizer (SmolLM2-135M-Instruct, ChatML), from the
  shared ``default_model_dir`` fixture (``tests/conftest.py``).
- ``llama_tokenizer``: a tiny byte-level BPE trained here, Llama-3 style headers, ``| trim`` on
  content, tools, and a non-special control token ``<tool_call>``.
- ``mistral_tokenizer``: a tiny SentencePiece-like BPE (Metaspace, prepend_scheme "first", byte
  fallback) with a Mistral ``[INST]`` template and added tokens that strip whitespace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = [
    "Hello world, this is a tiny corpus for a tiny tokenizer.",
    "The quick brown fox jumps over the lazy dog; the dog sleeps.",
    "def add(x, y):\n    return x + y\n\nprint(add(1, 2))\n",
    "Ça va? Naïve café, déjà vu. Grüße aus Köln! 你好，世界。",
    "    indented\n\n\n\tlines with tabs and  double  spaces  ",
    "Tool results: {\"temperature\": 21, \"unit\": \"celsius\"} -> ok.",
    "<html> a < b and c > d | e || f && g </html>",
    "You are a helpful assistant. Answer briefly and precisely.",
] * 8

LLAMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}{{ '<|start_header_id|>system<|end_header_id|>\n\nTools:\n' }}"
    "{% for t in tools %}{{ t | tojson }}{{ '\n' }}{% endfor %}{{ '<|eot_id|>' }}{% endif %}"
    "{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' }}"
    "{% if m['name'] is defined %}{{ 'name: ' + m['name'] + '\n' }}{% endif %}"
    "{{ m['content'] | trim }}"
    "{% if m['tool_calls'] is defined %}{% for tc in m['tool_calls'] %}"
    "{{ '\n<tool_call>' + (tc['function'] | tojson) + '</tool_call>' }}"
    "{% endfor %}{% endif %}"
    "{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

MISTRAL_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' or m['role'] == 'system' %}"
    "{{ '[INST] ' + m['content'] + ' [/INST]' }}"
    "{% elif m['role'] == 'tool' %}{{ '[TOOL_RESULTS] ' + m['content'] + '[/TOOL_RESULTS]' }}"
    "{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)


def _wrap(tok: Tokenizer, template: str, **special: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
    fast.chat_template = template
    return fast


def build_llama_tokenizer() -> Any:
    """Byte-level BPE, Llama-3 style specials."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                    AddedToken("</tool_call>", special=False, normalized=False)])
    return _wrap(tok, LLAMA_TEMPLATE, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                 additional_special_tokens=specials[1:3])


def build_mistral_tokenizer() -> Any:
    """SentencePiece-like BPE: Metaspace(prepend_scheme='first'), byte fallback, strip tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                 split=False)
    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    next_id = max(max(vocab.values()), max(e["id"] for e in spec["added_tokens"])) + 1
    for b in range(256):
        if f"<0x{b:02X}>" not in vocab:
            vocab[f"<0x{b:02X}>"] = next_id
            next_id += 1
    spec["model"]["byte_fallback"] = True
    spec["model"]["unk_token"] = "<unk>"
    for entry in spec["added_tokens"]:
        if entry["content"] == "</s>":
            entry["lstrip"] = True
        if entry["content"] == "[/TOOL_RESULTS]":
            entry["lstrip"] = True
        if entry["content"] == "[INST]":
            entry["rstrip"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return _wrap(tok, MISTRAL_TEMPLATE, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                 additional_special_tokens=specials[3:])


@pytest.fixture(scope="session")
def smol_tokenizer(default_model_dir: Path) -> Any:
    """The default model's tokenizer (SmolLM2-135M-Instruct), from the shared model fixture."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="session")
def llama_tokenizer() -> Any:
    return build_llama_tokenizer()


@pytest.fixture(scope="session")
def mistral_tokenizer() -> Any:
    return build_mistral_tokenizer()


def _family_tokenizer(name: str) -> Any:
    """A session fixture ``<name>_tokenizer`` over ``family_templates.BUILDERS[name]``."""

    @pytest.fixture(scope="session", name=f"{name}_tokenizer")
    def fixture() -> Any:
        from tests.prompt.family_templates import BUILDERS

        return BUILDERS[name]()

    return fixture


gemma_tokenizer = _family_tokenizer("gemma")
phi_tokenizer = _family_tokenizer("phi")
granite_tokenizer = _family_tokenizer("granite")
hermes_tokenizer = _family_tokenizer("hermes")


@pytest.fixture(scope="session", params=["smol", "llama", "mistral"])
def any_tokenizer(request: pytest.FixtureRequest) -> Any:
    """Each test tokenizer in turn."""
    return request.getfixturevalue(f"{request.param}_tokenizer")
