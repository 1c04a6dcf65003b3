"""Load a local Hugging Face directory of the Llama family into :class:`LlamaModel`.

Reads ``*.safetensors`` (single file or sharded with an index), casts to the requested dtype and
fuses q/k/v and gate/up. A missing or corrupt file raises :class:`ModelLoadError` naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from hermes_async.model.dtype import resolve_dtype
from hermes_async.model.llama import LlamaModel
from hermes_async.model.spec import ModelLoadError, ModelSpec, read_spec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def safetensors_files(model_dir: Path) -> list[Path]:
    """The checkpoint files: those named by ``model.safetensors.index.json`` or all of them."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise ModelLoadError(f"cannot read {index}: {e}") from e
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {model_dir}")
    for f in files:
        if not f.is_file():
            raise ModelLoadError(f"missing weight file {f}")
    return files


def read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                    tensors[name] = handle.get_tensor(name)
        except Exception as e:  # safetensors raises its own error types for bad headers/data
            raise ModelLoadError(f"corrupt or unreadable weight file {f}: {e}") from e
    return tensors


def load_model(model_dir: str | Path, dtype: str = "float32",
               device: torch.device | str = "cpu") -> LlamaModel:
    """Build a :class:`LlamaModel` from ``model_dir`` with weights in ``dtype`` on ``device``.

    ``dtype="auto"`` picks the machine's dtype (:func:`hermes_async.model.dtype.resolve_dtype`).
    """
    if dtype == "auto":
        dtype = resolve_dtype(dtype, torch.device(device))[0]
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelLoadError(f"model directory not found: {path}")
    if dtype not in DTYPES:
        raise ModelLoadError(f"unsupported dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    spec = read_spec(path)
    tensors = read_tensors(safetensors_files(path))
    model = LlamaModel(spec, DTYPES[dtype])
    _assign(model, spec, tensors, path)
    return model.to(device)


def _assign(model: LlamaModel, spec: ModelSpec, src: dict[str, torch.Tensor], path: Path) -> None:
    def take(name: str) -> torch.Tensor:
        if name not in src:
            raise ModelLoadError(f"weight {name!r} missing from the checkpoint in {path}")
        return src[name]

    def put(dst: torch.nn.Parameter | None, value: torch.Tensor, name: str) -> None:
        if dst is None:
            return
        if tuple(dst.shape) != tuple(value.shape):
            raise ModelLoadError(
                f"weight {name!r} in {path} has shape {tuple(value.shape)}, "
                f"config.json implies {tuple(dst.shape)}"
            )
        dst.data.copy_(value.to(dst.dtype))

    put(model.embed, take("model.embed_tokens.weight"), "model.embed_tokens.weight")
    put(model.final_norm, take("model.norm.weight"), "model.norm.weight")
    if model.lm_head is not None:
        put(model.lm_head, take("lm_head.weight"), "lm_head.weight")
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        put(layer.input_norm, take(p + "input_layernorm.weight"), p + "input_layernorm")
        put(layer.post_norm, take(p + "post_attention_layernorm.weight"), p + "post_attn_norm")
        qkv = [take(a + f"{n}_proj.weight") for n in "qkv"]
        put(layer.qkv_weight, torch.cat(qkv), a + "{q,k,v}_proj.weight")
        if layer.qkv_bias is not None:
            bias = [take(a + f"{n}_proj.bias") for n in "qkv"]
            put(layer.qkv_bias, torch.cat(bias), a + "{q,k,v}_proj.bias")
        put(layer.o_weight, take(a + "o_proj.weight"), a + "o_proj.weight")
        if layer.o_bias is not None:
            put(layer.o_bias, take(a + "o_proj.bias"), a + "o_proj.bias")
        gate_up = torch.cat([take(m + "gate_proj.weight"), take(m + "up_proj.weight")])
        put(layer.gate_up_weight, gate_up, m + "{gate,up}_proj.weight")
        put(layer.down_weight, take(m + "down_proj.weight"), m + "down_proj.weight")
        if layer.gate_up_bias is not None:
            bias = torch.cat([take(m + "gate_proj.bias"), take(m + "up_proj.bias")])
            put(layer.gate_up_bias, bias, m + "{gate,up}_proj.bias")
            put(layer.down_bias, take(m + "down_proj.bias"), m + "down_proj.bias")
