"""Whole KV blocks out of and into the pool, and the fingerprint that says what they mean.

:class:`PoolBlockIO` is the runner's :class:`~hermes_async.step.KVBlockIO` for the prefix
cache's disk tier: a block's payload is its K and V of every layer, in the pool's dtype and
layout, as raw bytes. :func:`kv_fingerprint` names everything that makes those bytes the same
KV: the weights (``config.json`` and each weight file's name, size and first and last MiB),
dtype, quantization, attention backend, block size, layout and pool shape, and the format
version: a block is only ever read back under the same fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from hermes_async.model.kv_pool import KVPool

FORMAT_VERSION = 1
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")
SAMPLE_BYTES = 1 << 20


def weights_digest(model_path: Path) -> str:
    """A digest of the model's files: config.json whole, each weight file by name, size and its
    first and last MiB (cheap at start-up; any re-saved or different checkpoint changes it)."""
    h = hashlib.blake2b(digest_size=16)
    files = [model_path] if model_path.is_file() else sorted(
        p for p in model_path.iterdir() if p.name == "config.json"
        or p.suffix in WEIGHT_SUFFIXES)
    for p in files:
        size = p.stat().st_size
        h.update(f"{p.name}\0{size}\0".encode())
        with open(p, "rb") as f:
            if p.name == "config.json":
                h.update(f.read())
                continue
            h.update(f.read(SAMPLE_BYTES))
            if size > 2 * SAMPLE_BYTES:
                f.seek(size - SAMPLE_BYTES)
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def kv_fingerprint(model_path: Path, *, dtype: str, quantization: str, activations: str,
                   attention: str, pool: KVPool) -> str:
    """The directory name of this model's blocks on disk (32 hex digits)."""
    s = pool.shape
    parts = {"format": FORMAT_VERSION, "weights": weights_digest(model_path), "dtype": dtype,
             "quantization": quantization, "activations": activations, "attention": attention,
             "layout": pool.layout, "block_size": s.block_size, "layers": s.num_layers,
             "kv_heads": s.num_kv_heads, "head_dim": s.head_dim, "kv_dtype": str(s.dtype)}
    return hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(),
                           digest_size=16).hexdigest()


class PoolBlockIO:
    """Copies of whole blocks (every layer, K and V) as bytes; see the module docstring."""

    def __init__(self, pool: KVPool, fingerprint: str) -> None:
        self.pool = pool
        self.fingerprint = fingerprint
        self.block_bytes = pool.shape.bytes_per_block

    @torch.inference_mode()
    def read_blocks(self, block_ids: Sequence[int]) -> list[bytes]:
        if not block_ids:
            return []
        index = torch.tensor(list(block_ids), dtype=torch.long, device=self.pool.device)
        # [layers, 2, n, ...] -> [n, layers, 2, ...]: one contiguous payload per block
        blocks = self.pool.tensor.index_select(2, index).movedim(2, 0).contiguous().cpu()
        raw = blocks.view(torch.uint8).reshape(len(block_ids), -1).numpy()
        return [row.tobytes() for row in raw]

    @torch.inference_mode()
    def write_blocks(self, block_ids: Sequence[int],
                     payloads: Sequence[bytes | memoryview]) -> None:
        if not block_ids:
            return
        if len(payloads) != len(block_ids) or any(len(p) != self.block_bytes for p in payloads):
            raise ValueError(f"{len(payloads)} payloads for {len(block_ids)} blocks of "
                             f"{self.block_bytes} bytes")
        t = self.pool.tensor
        shape = (len(block_ids), t.shape[0], t.shape[1], *t.shape[3:])
        raw = torch.frombuffer(bytearray().join(payloads), dtype=torch.uint8)
        blocks = raw.view(t.dtype).reshape(shape).to(t.device)
        index = torch.tensor(list(block_ids), dtype=torch.long, device=t.device)
        t.index_copy_(2, index, blocks.movedim(0, 2))
