"""SmolLM3: Llama with NoPE layers (``no_rope_layers``: 1 rotates, 0 does not) and windows by
``layer_types``."""

from hermes_async.model.families.base import Family, GGUFFacts, GGUFLayout
from hermes_async.model.spec import windows_from_layer_types

# llama.cpp's SmolLM3: every 4th layer without RoPE (its GGUF files state no pattern)
GGUF_NO_ROPE_INTERVAL = 4


def options(cfg: object) -> dict[str, object]:
    flags = getattr(cfg, "no_rope_layers", None) or []
    return {"rope_layers": tuple(bool(f) for f in flags),
            "sliding_windows": windows_from_layer_types(cfg)}


def gguf_config(facts: GGUFFacts) -> dict[str, object]:
    n = int(facts.get("block_count", 0))
    return {"no_rope_layers": [int((i + 1) % GGUF_NO_ROPE_INTERVAL != 0) for i in range(n)]}


FAMILY = Family("smollm3", ("SmolLM3ForCausalLM",), options,
                gguf=GGUFLayout("smollm3", "smollm3", permute_qk=True, config=gguf_config))
