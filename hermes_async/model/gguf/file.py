"""One GGUF file: its metadata, its tensors' shapes and each tensor dequantized to float32.

Parsing a GGUF's header with the ``gguf`` package's reader takes seconds for a large
vocabulary (every token is its own field part), so :meth:`GGUFFile.index` is taken once, when
the file's directory is prepared, and later opens rebuild from it (:meth:`GGUFFile.from_index`)
and read tensors straight from a memory map of the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hermes_async.model.families.base import GGUFFacts
from hermes_async.model.spec import ModelLoadError

# metadata too large to hold in the facts (the vocabulary): read by the tokenizer builder
_BULKY = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
          "tokenizer.ggml.scores", "tokenizer.ggml.precompiled_charsmap", "tokenizer.chat_template")


CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class TensorRecord:
    """Where one tensor lies in the file: GGML type number, shape (PyTorch order), offset and
    size in bytes."""

    type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class GGUFFile:
    """A GGUF's metadata (``values``, bulky tokenizer arrays left out), ``arch`` and tensors.
    Raises :class:`ModelLoadError` naming the file when it cannot be parsed."""

    def __init__(self, path: str | Path, values: dict[str, Any],
                 tensors: dict[str, TensorRecord], vocab_size: int | None) -> None:
        self.path = Path(path)
        self.values = values
        self._tensors = tensors
        self._vocab_size = vocab_size
        self._map: Any = None  # mmap.mmap of the file, opened at the first tensor read
        arch = values.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelLoadError(f"{self.path}: no general.architecture in the GGUF metadata")
        self.arch = arch

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        """Parse the header with the ``gguf`` package's reader."""
        from gguf import GGUFReader

        try:
            reader = GGUFReader(str(path))
        except Exception as e:  # the reader raises ValueError/struct.error/OSError
            raise ModelLoadError(f"cannot read GGUF file {path}: {e}") from e
        values = {name: field.contents() for name, field in reader.fields.items()
                  if not name.startswith("GGUF.") and name not in _BULKY}
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        tensors = {t.name: TensorRecord(int(t.tensor_type),
                                        tuple(int(n) for n in reversed(t.shape)),
                                        int(t.data_offset), int(t.n_bytes))
                   for t in reader.tensors}
        return cls(path, values, tensors, None if tokens is None else len(tokens.data))

    def index(self) -> dict[str, Any]:
        """JSON-able contents for :meth:`from_index`."""
        return {"values": self.values, "vocab_size": self._vocab_size,
                "tensors": {n: [r.type, list(r.shape), r.offset, r.nbytes]
                            for n, r in self._tensors.items()}}

    @classmethod
    def from_index(cls, path: str | Path, index: dict[str, Any]) -> GGUFFile:
        tensors = {n: TensorRecord(int(t), tuple(s), int(o), int(b))
                   for n, (t, s, o, b) in index["tensors"].items()}
        return cls(path, index["values"], tensors, index["vocab_size"])

    def vocab_size(self) -> int | None:
        """The tokenizer's vocabulary size (``tokenizer.ggml.tokens``), None without one."""
        return self._vocab_size

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape in PyTorch order (GGUF stores the fastest dimension first)."""
        return self._tensors[name].shape

    def facts(self) -> GGUFFacts:
        return GGUFFacts(self.arch, dict(self.values),
                         {name: r.shape for name, r in self._tensors.items()})

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def type_name(self, name: str) -> str:
        """The tensor's GGML type (``Q4_K``, ``F32``)."""
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self._tensors[name].type).name

    def type_counts(self) -> dict[str, int]:
        """How many tensors of each GGML type the file holds."""
        counts: dict[str, int] = {}
        for name in self._tensors:
            kind = self.type_name(name)
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def nbytes(self) -> int:
        """The bytes of all tensors as stored."""
        return sum(r.nbytes for r in self._tensors.values())

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes as the ``gguf`` package's dequantizer takes them: rows of
        blocks (uint8) for quantized types, the plain array for float types (a read-only view
        of the file)."""
        import mmap

        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape

        r = self._tensors[name]
        if self._map is None:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        data = np.frombuffer(self._map, dtype=np.uint8, count=r.nbytes, offset=r.offset)
        kind = GGMLQuantizationType(r.type)
        floats = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
        if kind in floats:
            return data.view(floats[kind]).reshape(r.shape)
        if kind not in GGML_QUANT_SIZES:
            raise ModelLoadError(f"{self.path}: tensor {name} has unknown type {r.type}")
        return data.reshape(quant_shape_to_byte_shape(r.shape, kind))

    def dequantized(self, name: str) -> torch.Tensor:
        """The tensor in float32, PyTorch shape (a fresh tensor: the file stays read-only).

        Quantized types go through the ``gguf`` package's block dequantizer, over chunks of
        about :data:`CHUNK_ELEMENTS` values (its own entry point splits every tensor into
        groups of 16 rows, ~5x slower on a 135M model)."""
        from gguf import GGMLQuantizationType, quants

        kind = GGMLQuantizationType(self._tensors[name].type)
        raw = self.raw(name)
        shape = self.shape(name)
        if raw.dtype != np.uint8:
            return torch.from_numpy(raw.astype(np.float32))
        codec = getattr(quants, kind.name, None)
        if codec is None:
            raise ModelLoadError(f"{self.path}: tensor {name} is of type {kind.name}, which "
                                 "cannot be dequantized")
        rows = raw.reshape(-1, raw.shape[-1])
        out = torch.empty((rows.shape[0], shape[-1]), dtype=torch.float32)
        step = max(1, CHUNK_ELEMENTS // shape[-1])
        try:
            for start in range(0, rows.shape[0], step):
                part = codec.dequantize_rows(rows[start:start + step])
                out[start:start + step] = torch.from_numpy(part)
        except NotImplementedError as e:
            raise ModelLoadError(f"{self.path}: tensor {name} is of type {kind.name}, which "
                                 "cannot be dequantized") from e
        return out.reshape(shape)
