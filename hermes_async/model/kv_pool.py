"""The paged KV pool: one tensor ``[layers, 2, num_blocks, block_size, kv_heads, head_dim]``
(layout ``nhd``) or ``[layers, 2, num_blocks, kv_heads, block_size, head_dim]`` (``hnd``), as
the attention backend wants it.

Block ids handed out by the prefix cache index its third dimension; the runner writes new K/V
through a slot mapping (``block_id * block_size + offset``) and reads a sequence's context back
through its block table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

MIN_BLOCK_SIZE = 16
MAX_BLOCK_SIZE = 128
BLOCK_ELEMENT_BUDGET = 16384  # K+V elements of one block in one layer (64 KiB in float32)


def derive_block_size(num_kv_heads: int, head_dim: int) -> int:
    """Tokens per block from the model's shape (the documented rule of ``configs/default.toml``).

    The largest power of two between 16 and 128 such that one block of one layer holds at most
    16384 K+V elements (64 KiB in float32, 32 KiB in bfloat16): small blocks for wide KV
    (more reuse granularity where a block is expensive), larger ones for narrow KV (fewer table
    entries where a block is cheap). SmolLM2-135M (3 KV heads x 64) -> 32; Llama-3-8B -> 16.
    """
    per_token = 2 * num_kv_heads * head_dim
    size = MAX_BLOCK_SIZE
    while size > MIN_BLOCK_SIZE and size * per_token > BLOCK_ELEMENT_BUDGET:
        size //= 2
    return size


def available_memory_bytes(device: torch.device) -> int:
    """Free memory on ``device``: ``cudaMemGetInfo`` on CUDA, MemAvailable on the host."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class KVPoolShape:
    """Shape of the pool; ``bytes_per_block`` covers all layers, K and V."""

    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size


def plan_num_blocks(
    *,
    num_layers: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    kv_cache_bytes: int | None,
    memory_fraction: float,
) -> KVPoolShape:
    """Size the pool from an explicit byte budget or a fraction of free device memory."""
    shape = KVPoolShape(num_layers, 1, block_size, num_kv_heads, head_dim, dtype)
    budget = kv_cache_bytes
    if budget is None:
        budget = int(available_memory_bytes(device) * memory_fraction)
    num_blocks = budget // shape.bytes_per_block
    if num_blocks < 2:
        raise ValueError(
            f"KV cache budget of {budget} bytes holds fewer than 2 blocks of "
            f"{shape.bytes_per_block} bytes; raise cache.kv_cache_bytes"
        )
    return KVPoolShape(num_layers, int(num_blocks), block_size, num_kv_heads, head_dim, dtype)


class KVPool:
    """Owns the KV tensor; :meth:`blocks` gives one layer's K and V in the pool's layout."""

    def __init__(self, shape: KVPoolShape, device: torch.device, layout: str = "nhd") -> None:
        if layout not in ("nhd", "hnd"):
            raise ValueError(f"KV layout must be nhd or hnd, not {layout!r}")
        self.shape = shape
        self.device = device
        self.layout = layout
        inner = ((shape.block_size, shape.num_kv_heads) if layout == "nhd"
                 else (shape.num_kv_heads, shape.block_size))
        self.tensor = torch.zeros(
            (shape.num_layers, 2, shape.num_blocks, *inner, shape.head_dim),
            dtype=shape.dtype,
            device=device,
        )

    @property
    def num_blocks(self) -> int:
        return self.shape.num_blocks

    @property
    def block_size(self) -> int:
        return self.shape.block_size

    def blocks(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer as ``[num_blocks, block_size, kv_heads, head_dim]`` (``nhd``)
        or ``[num_blocks, kv_heads, block_size, head_dim]`` (``hnd``)."""
        return self.tensor[layer, 0], self.tensor[layer, 1]

    def slots(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer as ``[num_slots, kv_heads, head_dim]`` (views, writable;
        ``nhd`` only)."""
        if self.layout != "nhd":
            raise ValueError("slot views exist for the nhd layout only")
        s = self.shape
        k, v = self.blocks(layer)
        return (k.view(s.num_slots, s.num_kv_heads, s.head_dim),
                v.view(s.num_slots, s.num_kv_heads, s.head_dim))

    def gather(self, layer: int, block_table: torch.Tensor,
               length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A sequence's first ``length`` K and V rows as ``[length, kv_heads, head_dim]``
        (copies, in either layout; for tests and checks)."""
        k, v = self.blocks(layer)
        if self.layout == "hnd":
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        return k[block_table].flatten(0, 1)[:length], v[block_table].flatten(0, 1)[:length]
