"""Write a Hugging Face directory of a supported family as a GGUF, laid out as llama.cpp's
converter lays it out (its tensor names, q/k permuted where it permutes them, Gemma's norms as
``1 + w``, experts merged per layer, the tokenizer as ``tokenizer.ggml.*`` metadata).

For tests and benchmarks: tiny random-weight models become GGUF files of every family and
quantization, and random-weight models of real shapes the same weights for llama.cpp and for
hermes. ``python -m hermes_async.model.gguf.writer DIR OUT.gguf --type Q8_0``.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hermes_async.model.spec import ModelLoadError, rotary_dim

QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K")
_EXPERT = re.compile(r"^(.*\.layers\.(\d+)\.mlp\.experts)\.(\d+)\.(\w+)\.weight$")


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (the inverse of ``tensors.unpermute_rows``)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def _encode(x: np.ndarray, qtype: str) -> tuple[np.ndarray, Any]:
    """``x`` as stored with ``qtype``: (array, raw GGML type or None for plain floats). A
    matrix whose rows do not divide into blocks stays float32, as llama.cpp does."""
    import gguf

    from hermes_async.model.gguf.kquants import quantize_q4_k

    if x.ndim < 2 or qtype == "F32":
        return x.astype(np.float32), None
    if qtype == "F16":
        return x.astype(np.float16), None
    kind = gguf.GGMLQuantizationType[qtype]
    block = gguf.GGML_QUANT_SIZES[kind][0]
    if x.shape[-1] % block:
        return x.astype(np.float32), None
    if qtype == "Q4_K":
        return quantize_q4_k(x), kind
    return gguf.quants.quantize(x.astype(np.float32), kind), kind


def _tokenizer_metadata(w: Any, tokenizer_dir: Path, vocab_size: int, pre: str) -> None:
    """The byte-level BPE of ``tokenizer_dir/tokenizer.json`` as llama.cpp's metadata."""
    import gguf

    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model = data["model"]
    if model.get("type") != "BPE":
        raise ModelLoadError(f"{tokenizer_dir}: only byte-level BPE tokenizers are written")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, i in model["vocab"].items():
        if i < vocab_size:
            tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for added in data.get("added_tokens", []):
        if added["id"] < vocab_size:
            tokens[added["id"]] = added["content"]
            types[added["id"]] = (gguf.TokenType.CONTROL if added.get("special")
                                  else gguf.TokenType.USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    ids = {t: i for i, t in enumerate(tokens)}
    for key, adder in (("bos_token", w.add_bos_token_id), ("eos_token", w.add_eos_token_id),
                       ("pad_token", w.add_pad_token_id)):
        token = config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if token in ids:
            adder(ids[token])
    w.add_add_bos_token(False)
    template = config.get("chat_template")
    jinja = tokenizer_dir / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    if template:
        w.add_chat_template(template)


def _family_metadata(arch: str, cfg: Any, w: Any) -> None:
    """The keys llama.cpp's converter writes beyond the common ones, per architecture."""
    extra: dict[str, Callable[[], None]] = {
        "granite": lambda: (w.add_embedding_scale(cfg.embedding_multiplier),
                            w.add_residual_scale(cfg.residual_multiplier),
                            w.add_attention_scale(cfg.attention_multiplier),
                            w.add_logit_scale(cfg.logits_scaling)),
        "qwen3moe": lambda: (w.add_expert_count(cfg.num_experts),
                             w.add_expert_used_count(cfg.num_experts_per_tok),
                             w.add_expert_feed_forward_length(cfg.moe_intermediate_size),
                             w.add_expert_weights_norm(bool(cfg.norm_topk_prob))),
        "gemma3": lambda: (w.add_sliding_window_pattern(
                               [t == "sliding_attention" for t in cfg.layer_types]),
                           w.add_rope_freq_base_swa(
                               cfg.rope_parameters["sliding_attention"]["rope_theta"]),
                           w.add_attention_scale(float(cfg.query_pre_attn_scalar) ** -0.5)),
        "gemma2": lambda: (w.add_attn_logit_softcapping(cfg.attn_logit_softcapping),
                           w.add_final_logit_softcapping(cfg.final_logit_softcapping),
                           w.add_attention_scale(float(cfg.query_pre_attn_scalar) ** -0.5)),
    }
    if arch in extra:
        extra[arch]()


def write_gguf(model_dir: str | Path, out: str | Path, qtype: str = "Q8_0",
               tokenizer_dir: str | Path | None = None, pre: str = "smollm",
               types: dict[str, str] | None = None) -> Path:
    """Write ``model_dir`` (a Hugging Face directory of a family with a GGUF layout) to
    ``out`` with its matrices in ``qtype`` (norms, biases and 1-D tensors in float32), or in
    ``types[suffix]`` for the tensors whose GGUF name ends with a suffix given there (a mix as
    llama.cpp's ``_M`` files have: ``{"attn_v.weight": "Q8_0"}``). The tokenizer comes from
    ``tokenizer_dir`` (default: ``model_dir``); ``pre`` names its pre-tokenizer as llama.cpp
    does (``tokenizer.ggml.pre``)."""
    import gguf
    from transformers import AutoConfig

    from hermes_async.model.families import family_for
    from hermes_async.model.families.llama import FAMILY as LLAMA
    from hermes_async.model.loader import read_tensors, safetensors_files

    types = types or {}
    for t in (qtype, *types.values()):
        if t not in QUANT_TYPES:
            raise ValueError(f"qtype {t!r}: one of {', '.join(QUANT_TYPES)}")

    def type_of(name: str) -> str:
        return next((t for suffix, t in types.items() if name.endswith(suffix)), qtype)

    model_dir, out = Path(model_dir), Path(out)
    cfg = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    family = family_for((cfg.architectures or [""])[0])
    if family is None or family.text_config:
        raise ModelLoadError(f"{model_dir}: no GGUF layout for {cfg.architectures}")
    if family.gguf is None and family.name == "mistral":
        family = LLAMA  # llama.cpp writes Mistral as llama
    layout = family.gguf
    assert layout is not None
    arch = layout.arch
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads

    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(model_dir.name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    rope = rope.get("full_attention", rope)
    w.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    w.add_rope_dimension_count(rotary_dim(cfg, rope))  # partial rotary: less than a head
    window = getattr(cfg, "sliding_window", None)
    if window:
        w.add_sliding_window(int(window))
    w.add_vocab_size(cfg.vocab_size)
    _family_metadata(arch, cfg, w)
    _tokenizer_metadata(w, Path(tokenizer_dir or model_dir), cfg.vocab_size, pre)

    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items()
                                          if v == arch), cfg.num_hidden_layers)
    src = read_tensors(safetensors_files(model_dir))
    experts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    for hf_name in sorted(src):
        m = _EXPERT.match(hf_name)
        if m is not None:
            experts.setdefault((m[1], m[4]), {})[int(m[3])] = src[hf_name]
            continue
        if tied and hf_name == "lm_head.weight":
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ModelLoadError(f"{model_dir}: no GGUF name for tensor {hf_name}")
        x = src[hf_name].float().numpy()
        short = name.split(".", 2)[-1]
        if layout.permute_qk and short in ("attn_q.weight", "attn_k.weight"):
            x = _permute(x, cfg.num_attention_heads if short == "attn_q.weight" else kv_heads)
        if family.norm_weight_offset and name.endswith("norm.weight"):
            x = x + family.norm_weight_offset
        data, raw = _encode(x, type_of(name))
        w.add_tensor(name, data, raw_dtype=raw)
    for (prefix, proj), stack in sorted(experts.items()):
        name = names.get_name(f"{prefix}.{proj}.weight", try_suffixes=(".weight",))
        x = torch.stack([stack[j] for j in sorted(stack)]).float().numpy()
        data, raw = _encode(x, type_of(name))
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--type", default="Q8_0", choices=QUANT_TYPES)
    parser.add_argument("--tokenizer-dir", default=None)
    parser.add_argument("--pre", default="smollm", help="tokenizer.ggml.pre (llama.cpp's name)")
    args = parser.parse_args(argv)
    print(write_gguf(args.model_dir, args.out, args.type, args.tokenizer_dir, args.pre))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
