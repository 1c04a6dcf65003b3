"""Load a local Hugging Face directory of a supported family into :class:`LlamaModel`.

Reads ``*.safetensors`` (single file or sharded with an index), casts to the requested dtype and
fuses q/k/v and gate/up; the tensor names are the family's (``families/*.py``). A missing or
corrupt file raises :class:`ModelLoadError` naming it.

From a GGUF with ``quantization="gguf"`` the linears (and the LM head) are taken as their
blocks' integers and scales (:meth:`~.gguf.tensors.GGUFTensors.quantized`) in place of float
parameters, which are then never written (their pages never touched): no float copy of them
exists at any point; so is the token table (tied: the head's blocks; untied: its own
``quantized_embed``), looked up row by row. The model's ``quant_report`` says what each
became.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Protocol

import torch
from safetensors import safe_open

from hermes_async.model.dtype import resolve_dtype
from hermes_async.model.gguf.file import GGUFFile
from hermes_async.model.llama import LlamaModel
from hermes_async.model.quant.apply import GGUF, QuantReport
from hermes_async.model.quant.weights import ROWS, QuantizedWeight, concat_rows
from hermes_async.model.spec import ModelLoadError, ModelSpec, read_spec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
log = logging.getLogger("hermes_async.model")


class TensorSource(Protocol):
    """Checkpoint tensors by Hugging Face name: a dict of safetensors, or a GGUF's view."""

    def __contains__(self, name: object) -> bool: ...
    def __getitem__(self, name: str) -> torch.Tensor: ...


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


class BlockSource(Protocol):
    """A checkpoint's linears as integers and scales (a GGUF's view)."""

    def quantized(self, name: str) -> tuple[QuantizedWeight, str] | None: ...


def load_model(model_dir: str | Path, dtype: str = "float32",
               device: torch.device | str = "cpu", quantization: str = "none") -> LlamaModel:
    """Build a :class:`LlamaModel` from ``model_dir`` with weights in ``dtype`` on ``device``.

    ``dtype="auto"`` picks the machine's dtype (:func:`hermes_async.model.dtype.resolve_dtype`).
    ``quantization="gguf"`` keeps a GGUF's blocks (module docstring); the model's
    ``quant_report`` is then a :class:`QuantReport` (None otherwise).
    """
    if dtype == "auto":
        dtype = resolve_dtype(dtype, torch.device(device))[0]
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelLoadError(f"model directory not found: {path}")
    if dtype not in DTYPES:
        raise ModelLoadError(f"unsupported dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    spec = read_spec(path)
    tensors: TensorSource
    from hermes_async.model.gguf.directory import gguf_file

    gguf = gguf_file(path)
    if gguf is not None:
        tensors, spec = _gguf_tensors(gguf, spec, dtype, quantization)
    else:
        if quantization == GGUF:
            raise ModelLoadError(f"quantization gguf keeps a GGUF file's blocks, and {path} is "
                                 "a Hugging Face directory: serve its .gguf, or quantize with "
                                 "int8 / int4")
        tensors = read_tensors(safetensors_files(path))
    model = LlamaModel(spec, DTYPES[dtype])
    blocks = tensors if quantization == GGUF else None
    model.quant_report = _assign(model, spec, tensors, path, blocks)
    return model.to(device)


def _gguf_tensors(file: GGUFFile, spec: ModelSpec, dtype: str,
                  quantization: str) -> tuple[TensorSource, ModelSpec]:
    """The GGUF's tensors (dequantized once each, as they are loaded) and the spec with the
    file's RoPE frequency factors (``rope_freqs.weight``: Llama 3.x) applied."""
    from hermes_async.model.families import family_for
    from hermes_async.model.gguf.tensors import GGUFTensors

    family = family_for(spec.architecture)
    assert family is not None
    gguf_path = file.path
    types = ", ".join(f"{n} {t}" for t, n in sorted(file.type_counts().items()))
    if quantization == GGUF:
        log.info("GGUF %s: %s tensors (%.1f MiB); the linears' blocks kept (quantization gguf)",
                 gguf_path.name, types, file.nbytes() / 2**20)
    else:
        log.info("GGUF %s: %s tensors (%.1f MiB) dequantized to %s at load (--quantization "
                 "gguf keeps the linears' blocks)", gguf_path.name, types, file.nbytes() / 2**20,
                 dtype)
    if "rope_factors_long.weight" in file:
        raise ModelLoadError(f"{gguf_path}: longrope factors (rope_factors_long.weight) are not "
                             "read from GGUF files yet; serve the Hugging Face directory")
    if "rope_freqs.weight" in file:
        factors = file.dequantized("rope_freqs.weight")
        if factors.shape != spec.inv_freq.shape:
            raise ModelLoadError(f"{gguf_path}: rope_freqs.weight has shape "
                                 f"{tuple(factors.shape)}, expected {tuple(spec.inv_freq.shape)}")
        spec = dataclasses.replace(spec, inv_freq=spec.inv_freq / factors)
    return GGUFTensors(file, family, spec.num_heads, spec.num_kv_heads), spec


def _assign(model: LlamaModel, spec: ModelSpec, src: TensorSource, path: Path,
            blocks: BlockSource | None = None) -> QuantReport | None:
    """Copy the checkpoint into ``model``; with ``blocks``, its linears as their integers
    (the report of what each became)."""
    from hermes_async.model.families import family_for

    family = family_for(spec.architecture)
    assert family is not None  # read_spec found it
    names = family.names

    def require(name: str) -> None:
        if name not in src:
            raise ModelLoadError(f"weight {name!r} missing from the checkpoint in {path}")

    def take(name: str) -> torch.Tensor:
        require(name)
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

    def put_named(dst: torch.nn.Parameter | None, name: str | None) -> None:
        if dst is not None and name is not None:
            put(dst, take(name), name)

    def put_norm(dst: torch.nn.Parameter | None, name: str | None) -> None:
        if dst is not None and name is not None:  # (1 + w) folded once, in float32
            put(dst, take(name).float() + family.norm_weight_offset, name)

    report = QuantReport(GGUF, ROWS) if blocks is not None else None

    def put_blocks(owner: torch.nn.Module, attr: str, parts: list[str]) -> bool:
        """``owner.attr`` as the blocks of ``parts`` (fused in order) if they are quantized."""
        if blocks is None or report is None:
            return False
        for name in parts:  # the float path's error for a missing tensor, nothing read
            require(name)
        found = [blocks.quantized(name) for name in parts]
        if any(f is None for f in found):
            return False
        q, changed = concat_rows([f[0] for f in found])  # type: ignore[index]
        label = parts[0] if len(parts) == 1 else f"{parts[0]} (+{len(parts) - 1} fused)"
        dst = getattr(owner, attr)
        if tuple(dst.shape) != q.shape:
            raise ModelLoadError(f"weight {label!r} in {path} has shape {q.shape}, "
                                 f"config.json implies {tuple(dst.shape)}")
        report.add(dst, q, [f[1] for f in found], changed)  # type: ignore[index]
        del owner._parameters[attr]
        setattr(owner, attr, q)
        return True

    def put_linear(owner: torch.nn.Module, attr: str, parts: list[str], label: str) -> None:
        if getattr(owner, attr) is None or put_blocks(owner, attr, parts):
            return
        put(getattr(owner, attr), torch.cat([take(n) for n in parts]) if len(parts) > 1
            else take(parts[0]), label)

    put_norm(model.final_norm, names.final_norm)
    if put_blocks(model, "embed", [names.embed]):  # looked up in its blocks (dequantize_rows)
        table, model.embed = model.embed, None
        if model.lm_head is None:  # tied: the same blocks are the LM head
            model.quantized_head = table  # type: ignore[assignment]
        else:
            model.quantized_embed = table  # type: ignore[assignment]
    else:
        put(model.embed, take(names.embed), names.embed)
    if model.lm_head is not None:
        if put_blocks(model, "lm_head", [names.lm_head]):
            model.quantized_head, model.lm_head = model.lm_head, None  # type: ignore[assignment]
        else:
            put(model.lm_head, take(names.lm_head), names.lm_head)
    for i, layer in enumerate(model.layers):
        p = names.layer.format(i=i)
        a = p + names.attention
        m = p + names.mlp
        for dst, rel in ((layer.input_norm, names.input_norm), (layer.mlp_norm, names.mlp_norm),
                         (layer.attn_out_norm, names.attn_out_norm),
                         (layer.mlp_out_norm, names.mlp_out_norm),
                         (layer.q_norm, names.q_norm), (layer.k_norm, names.k_norm)):
            put_norm(dst, None if rel is None else p + rel)
        if names.fused_qkv is not None:
            put_linear(layer, "qkv_weight", [p + names.fused_qkv], p + names.fused_qkv)
        else:
            put_linear(layer, "qkv_weight", [a.format(name=n) + "weight" for n in "qkv"],
                       a.format(name="{q,k,v}") + "weight")
        if layer.qkv_bias is not None:
            bias = [take(a.format(name=n) + "bias") for n in "qkv"]
            put(layer.qkv_bias, torch.cat(bias), a.format(name="{q,k,v}") + "bias")
        o = a.format(name="o") + "weight"
        put_linear(layer, "o_weight", [o], o)
        put_named(layer.o_bias, a.format(name="o") + "bias")
        if layer.router_weight is not None:
            _assign_experts(layer, spec, p, names, take, put)
            continue
        if names.fused_gate_up is not None:
            fused = p + names.fused_gate_up
            put_linear(layer, "gate_up_weight", [fused], fused)
        else:
            put_linear(layer, "gate_up_weight",
                       [m.format(name=n) + "weight" for n in ("gate", "up")],
                       m.format(name="{gate,up}") + "weight")
        down = m.format(name="down") + "weight"
        put_linear(layer, "down_weight", [down], down)
        if layer.gate_up_bias is not None:
            bias = torch.cat([take(m.format(name="gate") + "bias"),
                              take(m.format(name="up") + "bias")])
            put(layer.gate_up_bias, bias, m.format(name="{gate,up}") + "bias")
            put_named(layer.down_bias, m.format(name="down") + "bias")
    return report


def _assign_experts(layer: torch.nn.Module, spec: ModelSpec, prefix: str, names: object,
                    take: object, put: object) -> None:
    """A mixture-of-experts layer: the router, and every expert's gate/up and down stacked
    (``[E, hidden, 2 I]`` and ``[E, I, hidden]``: the ``x @ W`` layout of grouped matmuls)."""
    router = prefix + names.router  # type: ignore[attr-defined]
    put(layer.router_weight, take(router), router)  # type: ignore[operator]

    def expert(j: int, name: str) -> torch.Tensor:
        return take(prefix + names.expert.format(j=j, name=name))  # type: ignore[attr-defined,operator]

    gate_up = torch.stack([torch.cat([expert(j, "gate"), expert(j, "up")]).t()
                           for j in range(spec.num_experts)])
    down = torch.stack([expert(j, "down").t() for j in range(spec.num_experts)])
    put(layer.experts_gate_up, gate_up.contiguous(), prefix + "mlp.experts.*.{gate,up}_proj")  # type: ignore[operator]
    put(layer.experts_down, down.contiguous(), prefix + "mlp.experts.*.down_proj")  # type: ignore[operator]
