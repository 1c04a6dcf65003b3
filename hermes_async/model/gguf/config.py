"""A GGUF's metadata as a transformers config (``config.json``) and its end-of-turn tokens.

The keys every family shares (llama.cpp's ``{arch}.embedding_length``, ``.block_count``,
``.attention.head_count``, ``.rope.freq_base``, ...) are mapped here; a family's own (Granite's
multipliers, Qwen3-MoE's experts, Gemma 3's window pattern) by its ``GGUFLayout.config``.
"""

from __future__ import annotations

from typing import Any

from hermes_async.model.families import FAMILIES
from hermes_async.model.families.base import Family, GGUFFacts
from hermes_async.model.gguf.file import GGUFFile
from hermes_async.model.spec import ModelLoadError

# the texts llama.cpp also ends a generation on (beside tokenizer.ggml.eos_token_id)
END_OF_TURN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>",
                     "<|end|>", "<|return|>")


def family_for_gguf(arch: str) -> Family:
    """The family whose GGUF files state ``general.architecture = arch``."""
    for family in FAMILIES:
        if family.gguf is not None and family.gguf.arch == arch:
            return family
    known = sorted({f.gguf.arch for f in FAMILIES if f.gguf is not None})
    raise ModelLoadError(f"GGUF architecture {arch!r} is not supported; hermes_async reads "
                         f"GGUF files of {', '.join(known)}")


def _scalar(facts: GGUFFacts, key: str, default: Any = None) -> Any:
    value = facts.get(key, default)
    if isinstance(value, list):  # per-layer values (some converters): one value or refuse
        if len(set(value)) != 1:
            raise ModelLoadError(f"GGUF {facts.arch}.{key}: per-layer values {value} are not "
                                 "supported")
        value = value[0]
    return value


def _required(facts: GGUFFacts, key: str) -> Any:
    value = _scalar(facts, key)
    if value is None:
        raise ModelLoadError(f"GGUF metadata lacks {facts.arch}.{key}")
    return value


def _rope_parameters(facts: GGUFFacts, head_dim: int) -> dict[str, Any]:
    params: dict[str, Any] = {"rope_type": "default",
                              "rope_theta": float(_scalar(facts, "rope.freq_base", 10000.0))}
    rotary = _scalar(facts, "rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim:
        params["partial_rotary_factor"] = int(rotary) / head_dim
    kind = _scalar(facts, "rope.scaling.type")
    factor = _scalar(facts, "rope.scaling.factor")
    if kind in ("linear", "yarn") and factor:
        params.update(rope_type=kind, factor=float(factor))
        original = _scalar(facts, "rope.scaling.original_context_length")
        if original:
            params["original_max_position_embeddings"] = int(original)
    elif kind not in (None, "none"):
        raise ModelLoadError(f"GGUF rope scaling {kind!r} is not supported")
    return params


def hf_config(file: GGUFFile) -> dict[str, Any]:
    """The ``config.json`` contents of the model in ``file``."""
    family = family_for_gguf(file.arch)
    layout = family.gguf
    assert layout is not None
    facts = file.facts()
    hidden = int(_required(facts, "embedding_length"))
    heads = int(_required(facts, "attention.head_count"))
    head_dim = int(_scalar(facts, "attention.key_length", hidden // heads))
    vocab = file.vocab_size() or int(_scalar(facts, "vocab_size", 0)) or \
        facts.tensors["token_embd.weight"][0]
    rope = _rope_parameters(facts, head_dim)
    tok = file.values
    cfg: dict[str, Any] = {
        "architectures": [family.architectures[0]],
        "model_type": layout.model_type,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(_scalar(facts, "feed_forward_length", 0)),
        "num_hidden_layers": int(_required(facts, "block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_scalar(facts, "attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": facts.float("attention.layer_norm_rms_epsilon", 1e-6),
        "max_position_embeddings": int(_scalar(facts, "context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in facts.tensors,
        "attention_bias": "blk.0.attn_q.bias" in facts.tensors,
        "rope_parameters": rope,
        "rope_theta": rope["rope_theta"],
        "bos_token_id": tok.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": tok.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": tok.get("tokenizer.ggml.padding_token_id"),
        "dtype": "bfloat16",
    }
    window = _scalar(facts, "attention.sliding_window")
    if window:
        cfg["sliding_window"] = int(window)
    cfg.update(layout.config(facts))
    return cfg


def end_of_turn_ids(file: GGUFFile, tokens: dict[str, int]) -> list[int]:
    """``tokenizer.ggml.eos_token_id``, then every end-of-turn token of the vocabulary
    (``tokens``: text to id) that llama.cpp also stops on."""
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                "tokenizer.ggml.eom_token_id"):
        value = file.values.get(key)
        if isinstance(value, int) and value not in ids:
            ids.append(value)
    for text in END_OF_TURN_TEXTS:
        token = tokens.get(text)
        if token is not None and token not in ids:
            ids.append(token)
    return ids
