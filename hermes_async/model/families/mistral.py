"""Mistral: Llama with ``sliding_window`` on every layer."""

from hermes_async.model.families.base import Family


def options(cfg: object) -> dict[str, object]:
    window = getattr(cfg, "sliding_window", None)
    return {"sliding_windows": (window,) * cfg.num_hidden_layers}  # type: ignore[attr-defined]


FAMILY = Family("mistral", ("MistralForCausalLM",), options)
