"""Llama (1-3.x, SmolLM, SmolLM2): the reference shape every other family differs from.
Llama 3.x's ``llama3`` RoPE scaling comes from transformers' RoPE functions (spec.py)."""

from hermes_async.model.families.base import Family, GGUFLayout

# llama.cpp's converter interleaves q/k rows for its RoPE (undone at load); Mistral's
# GGUF files say "llama" too and are served by this family
FAMILY = Family("llama", ("LlamaForCausalLM",),
                gguf=GGUFLayout("llama", "llama", permute_qk=True))
