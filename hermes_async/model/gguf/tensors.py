"""A GGUF's tensors under the Hugging Face names a family's loader asks for.

The names are mapped with the ``gguf`` package's own table (``get_tensor_name_map``: the one
llama.cpp's converter writes with), and the converter's changes undone so that each tensor
equals the Hugging Face checkpoint's:

* q/k rows permuted back where the family's converter interleaved them for llama.cpp's RoPE
  (``GGUFLayout.permute_qk``: Llama, Granite, SmolLM3);
* RMSNorm weights stored as ``1 + w`` (Gemma: llama.cpp adds the 1 at conversion) get the 1
  taken off again, the loader adding it back as for a Hugging Face checkpoint;
* experts, stored merged per layer (``blk.N.ffn_gate_exps``: ``[E, I, hidden]``), are served
  one by one (``mlp.experts.J.gate_proj.weight``) from one dequantization per layer.

:meth:`GGUFTensors.quantized` gives a linear's weight as its blocks' integers and scales
instead (``model.quantization = "gguf"``: :mod:`.blocks`), the q/k permutation undone on them.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from hermes_async.model.families.base import Family
from hermes_async.model.gguf.blocks import EXACT, REQUANTIZED, decode_blocks, requantize
from hermes_async.model.gguf.file import GGUFFile
from hermes_async.model.quant.weights import QuantizedWeight

FLOAT_TYPES = ("F32", "F16", "BF16", "F64")

_EXPERT = re.compile(
    r"^(?P<layer>.*\.layers\.\d+\.mlp\.experts)\.(?P<j>\d+)\.(?P<name>\w+)\.weight$")


def unpermute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k permutation (each head's halves interleaved) for ``heads`` heads."""
    rows = w.shape[0]
    return (w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


class GGUFTensors:
    """Read-only mapping from Hugging Face tensor names to the GGUF's tensors (float32)."""

    def __init__(self, file: GGUFFile, family: Family, num_heads: int, num_kv_heads: int) -> None:
        import gguf

        assert family.gguf is not None
        self.file = file
        self.family = family
        self._heads = {"attn_q.weight": num_heads, "attn_k.weight": num_kv_heads}
        arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == file.arch)
        blocks = int(file.values.get(f"{file.arch}.block_count", 0))
        self._names = gguf.get_tensor_name_map(arch, blocks)
        self._merged: dict[str, torch.Tensor] = {}  # one layer's dequantized expert stacks

    def gguf_name(self, hf_name: str) -> str | None:
        """The GGUF tensor holding ``hf_name`` (for an expert: its layer's merged stack)."""
        m = _EXPERT.match(hf_name)
        if m is not None:
            hf_name = f"{m['layer']}.{m['name']}.weight"
        return self._names.get_name(hf_name, try_suffixes=(".weight", ".bias"))

    def __contains__(self, hf_name: object) -> bool:
        if not isinstance(hf_name, str):
            return False
        name = self.gguf_name(hf_name)
        return name is not None and name in self.file

    def __getitem__(self, hf_name: str) -> torch.Tensor:
        name = self.gguf_name(hf_name)
        if name is None or name not in self.file:
            raise KeyError(hf_name)
        m = _EXPERT.match(hf_name)
        if m is not None:
            return self._expert(name, int(m["j"]))
        w = self._unpermuted(name, self.file.dequantized(name))
        if self.family.norm_weight_offset and name.endswith("norm.weight"):
            w = w - self.family.norm_weight_offset
        return w

    def _unpermuted(self, name: str, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (a tensor of ``name``'s rows, or of its integers or scales) with llama.cpp's
        q/k permutation undone where the family's converter applied it."""
        layout = self.family.gguf
        assert layout is not None
        suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
        if layout.permute_qk and suffix in self._heads:
            return unpermute_rows(rows, self._heads[suffix])
        return rows

    def quantized(self, hf_name: str) -> tuple[QuantizedWeight, str] | None:
        """``hf_name``'s 2-D weight as integers and scales (rows layout) and what was done
        (``"Q4_K -> int4"``): an exact form of its blocks (:data:`.blocks.EXACT`), or int8 from
        its values for other block types; None for a float tensor (kept as such) or an
        expert's."""
        name = self.gguf_name(hf_name)
        if name is None or name not in self.file:
            raise KeyError(hf_name)
        kind = self.file.type_name(name)
        shape = self.file.shape(name)
        if kind in FLOAT_TYPES or len(shape) != 2 or _EXPERT.match(hf_name):
            return None
        if kind not in EXACT:
            q = requantize(self._unpermuted(name, self.file.dequantized(name)))
            return q, f"{kind} -> {REQUANTIZED}"
        q = decode_blocks(self.file.raw(name), kind, (shape[0], shape[1]))
        q = dataclasses.replace(q, values=self._unpermuted(name, q.values),
                                scales=self._unpermuted(name, q.scales),
                                mins=None if q.mins is None else self._unpermuted(name, q.mins))
        return q, f"{kind} -> {q.scheme}"

    def _expert(self, name: str, j: int) -> torch.Tensor:
        stack = self._merged.get(name)
        if stack is None:
            if len(self._merged) >= 3:  # gate, up, down of one layer at a time
                self._merged.clear()
            stack = self._merged[name] = self.file.dequantized(name)
        return stack[j]
