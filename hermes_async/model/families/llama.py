"""Llama (1-3.x, SmolLM, SmolLM2): the reference shape every other family differs from.
Llama 3.x's ``llama3`` RoPE scaling comes from transformers' RoPE functions (spec.py)."""

from hermes_async.model.families.base import Family

FAMILY = Family("llama", ("LlamaForCausalLM",))
