"""Whole-block copies out of and into the KV pool (the disk tier's payloads) and the
fingerprint that keeps other models' blocks apart."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hermes_async.model.kv_blocks import PoolBlockIO, kv_fingerprint
from hermes_async.model.kv_pool import KVPool, KVPoolShape


def pool(layout: str, dtype: torch.dtype) -> KVPool:
    p = KVPool(KVPoolShape(3, 8, 4, 2, 16, dtype), torch.device("cpu"), layout)
    g = torch.Generator().manual_seed(0)
    p.tensor.copy_(torch.randn(p.tensor.shape, generator=g).to(dtype))
    return p


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_round_trip_bit_for_bit(layout: str, dtype: torch.dtype) -> None:
    p = pool(layout, dtype)
    io = PoolBlockIO(p, "fp")
    before = p.tensor.clone()
    payloads = io.read_blocks([5, 1, 6])
    assert [len(x) for x in payloads] == [p.shape.bytes_per_block] * 3
    assert torch.equal(p.tensor, before)  # reading changes nothing
    io.write_blocks([0, 7, 3], [memoryview(x) for x in payloads])
    for src, dst in ((5, 0), (1, 7), (6, 3)):
        assert torch.equal(p.tensor[:, :, dst], before[:, :, src])
    for untouched in (1, 2, 4, 5, 6):
        assert torch.equal(p.tensor[:, :, untouched], before[:, :, untouched])
    with pytest.raises(ValueError):
        io.write_blocks([2], [payloads[0][:-1]])


def test_the_fingerprint_names_weights_dtype_and_layout(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    (model / "model.safetensors").write_bytes(b"x" * 4096)
    p32, p16 = pool("nhd", torch.float32), pool("nhd", torch.bfloat16)

    def fp(p: KVPool = p32, **kw: str) -> str:
        args = {"dtype": "float32", "quantization": "none", "activations": "float",
                "attention": "Torch", **kw}
        return kv_fingerprint(model, pool=p, **args)

    base = fp()
    assert fp() == base  # stable across starts
    assert fp(p16, dtype="bfloat16") != base
    assert fp(quantization="int8") != base
    assert fp(pool("hnd", torch.float32)) != base
    (model / "model.safetensors").write_bytes(b"y" * 4096)  # other weights
    assert fp() != base
