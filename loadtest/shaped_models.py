"""Random-weight models in the real models' shapes, saved as Hugging Face directories, for
speed figures of each family (honest for speed, not for quality).

    python loadtest/shaped_models.py qwen3-0.6b /tmp/qwen3-0.6b      # then:
    python loadtest/bench_runner.py --model /tmp/qwen3-0.6b --dtypes bfloat16 --batches 1 8

The shapes are the published ``config.json`` values of each model; ``--layers N`` keeps only
the first N decoder layers (a MoE model of 30B parameters does not fit this machine's memory;
the per-layer figures scale). Weights are random normal (std 0.02), in bfloat16 on disk.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

SHAPES: dict[str, tuple[str, dict]] = {
    "qwen3-0.6b": ("Qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                 vocab_size=151936, tie_word_embeddings=True,
                                 max_position_embeddings=40960,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen3-1.7b": ("Qwen3", dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                 vocab_size=151936, tie_word_embeddings=True,
                                 max_position_embeddings=40960,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen3-30b-a3b": ("Qwen3Moe", dict(hidden_size=2048, intermediate_size=6144,
                                       moe_intermediate_size=768, num_experts=128,
                                       num_experts_per_tok=8, norm_topk_prob=True,
                                       decoder_sparse_step=1, mlp_only_layers=[],
                                       num_hidden_layers=48, num_attention_heads=32,
                                       num_key_value_heads=4, head_dim=128, vocab_size=151936,
                                       tie_word_embeddings=False, max_position_embeddings=40960,
                                       rope_parameters={"rope_type": "default",
                                                        "rope_theta": 1e6})),
}


def make(name: str, out: Path, layers: int | None = None) -> Path:
    import transformers as tf

    kind, shape = SHAPES[name]
    shape = dict(shape)
    if layers is not None:
        shape["num_hidden_layers"] = layers
    config = getattr(tf, f"{kind}Config")(**shape, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = getattr(tf, f"{kind}ForCausalLM")(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02)
    model.save_pretrained(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=None, help="keep the first N layers only")
    args = ap.parse_args()
    print(make(args.name, args.out, args.layers))


if __name__ == "__main__":
    main()
