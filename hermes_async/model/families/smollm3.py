"""SmolLM3: Llama with NoPE layers (``no_rope_layers``: 1 rotates, 0 does not) and windows by
``layer_types``."""

from hermes_async.model.families.base import Family
from hermes_async.model.spec import windows_from_layer_types


def options(cfg: object) -> dict[str, object]:
    flags = getattr(cfg, "no_rope_layers", None) or []
    return {"rope_layers": tuple(bool(f) for f in flags),
            "sliding_windows": windows_from_layer_types(cfg)}


FAMILY = Family("smollm3", ("SmolLM3ForCausalLM",), options)
