"""The model families the runner serves: one file each, and one line here.

Each module defines ``FAMILY`` (:class:`~.base.Family`): the architectures it covers, the
:class:`~hermes_async.model.spec.ModelSpec` options it sets from its transformers config, and
its checkpoint's tensor names. To add a family: a module stating how it differs from Llama, its
``FAMILY`` in :data:`FAMILIES`, and its tiny config in ``tests/tiny_models.py`` (the parity
suite then runs it against transformers on every backend).
"""

from __future__ import annotations

from hermes_async.model.families import (
    gemma2,
    gemma3,
    granite,
    llama,
    mistral,
    olmo2,
    phi3,
    qwen2,
    qwen3,
    qwen3_moe,
    seed_oss,
    smollm3,
)
from hermes_async.model.families.base import Family, TensorNames

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY, mistral.FAMILY, qwen2.FAMILY, qwen3.FAMILY, granite.FAMILY, olmo2.FAMILY,
    smollm3.FAMILY, seed_oss.FAMILY, gemma3.FAMILY, gemma3.MULTIMODAL, qwen3_moe.FAMILY,
    phi3.FAMILY, gemma2.FAMILY,
)

__all__ = ["FAMILIES", "Family", "TensorNames", "family_for", "supported_architectures"]


def family_for(architecture: str) -> Family | None:
    """The family of a Hugging Face architecture name (``Qwen3ForCausalLM``), or None."""
    return next((f for f in FAMILIES if architecture in f.architectures), None)


def supported_architectures() -> list[str]:
    return sorted(a for f in FAMILIES for a in f.architectures)
