"""A GGUF's quantized blocks as :class:`~hermes_async.model.quant.weights.QuantizedWeight`
(``model.quantization = "gguf"``): the integers and scales read out of the blocks, no float
copy of the weight.

Most of llama.cpp's block types are an integer times a per-block scale (plus a per-block
offset), which is exactly what our int8 / int4 weights hold:

====== ============================== =================================================
type   stored                         kept as
====== ============================== =================================================
Q8_0   ``d * q``, q int8, 32 a block  int8, groups of 32: ``scale = d``
Q4_0   ``d * (q - 8)``, q 4-bit       int4, groups of 32: ``scale = d``, ``min = -8 d``
Q4_1   ``d * q + m``                  int4, groups of 32: ``scale = d``, ``min = m``
Q5_0   ``d * (q - 16)``, q 5-bit      int8, groups of 32: ``q - 16`` in [-16, 15]
Q4_K   ``d sc_j * q - dmin m_j``      int4, groups of 32: ``scale = d sc_j``,
       (8 sub-blocks of 32 a 256)     ``min = -dmin m_j`` (both exact in float32)
Q6_K   ``d sc_j * (q - 32)``, 6-bit   int8, groups of 16: ``scale = d sc_j``
====== ============================== =================================================

so those weights dequantize to the file's values bit for bit (``QuantizedWeight.dequantize``
computes ``q * scale + min`` in float32, as the ``gguf`` package's dequantizer does).

The rest have no such form in our kernels: Q5_1 and Q5_K are 5-bit with an offset (int8 has
none), the 2- and 3-bit K-quants and the IQ types are not a plain integer times a scale. They
are dequantized one tensor at a time by the ``gguf`` package and quantized to int8 in groups of
32 (within half an int8 step of each group's largest magnitude, far below their own step):
:data:`REQUANTIZED` names what happened in the start-up report.
"""

from __future__ import annotations

import numpy as np
import torch

from hermes_async.model.quant.weights import ROWS, QuantizedWeight, quantize_int8

EXACT = {"Q8_0": ("int8", 32), "Q4_0": ("int4", 32), "Q4_1": ("int4", 32),
         "Q5_0": ("int8", 32), "Q4_K": ("int4", 32), "Q6_K": ("int8", 16)}
REQUANTIZED = "int8 (requantized)"
REQUANTIZE_GROUP = 32


def _half(raw: np.ndarray) -> np.ndarray:
    """float16 bytes ``[..., 2]`` as float32 ``[...]``."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``[..., 16]`` bytes as 32 values: the low nibbles, then the high ones."""
    return np.concatenate((qs & 15, qs >> 4), axis=-1)


def _q8_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    return np.ascontiguousarray(b[..., 2:]).view(np.int8), _half(b[..., 0:2]), None


def _q4_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _half(b[..., 0:2])
    return _nibbles(b[..., 2:18]), d, -8 * d


def _q4_1(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _nibbles(b[..., 4:20]), _half(b[..., 0:2]), _half(b[..., 2:4])


def _q5_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    qh = np.ascontiguousarray(b[..., 2:6]).view(np.uint32)  # [..., 1]: bit j is value j's 5th
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    q = (_nibbles(b[..., 6:22]) | (high << 4)).astype(np.int8) - np.int8(16)
    return q, _half(b[..., 0:2]), None


def _q4_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from gguf.quants import Q4_K

    lead = b.shape[:-1]
    d, dmin = _half(b[..., 0:2])[..., None], _half(b[..., 2:4])[..., None]
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(b[..., 4:16]).reshape(-1, 12))
    scales = (d * sc.reshape(*lead, 8).astype(np.float32))
    mins = -(dmin * m.reshape(*lead, 8).astype(np.float32))
    qs = b[..., 16:144].reshape(*lead, 4, 32)  # 4 chunks of 64 values: low nibbles, high
    q = np.stack((qs & 15, qs >> 4), axis=-2).reshape(*lead, 256)
    return q, scales, mins


def _q6_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    lead = b.shape[:-1]
    ql = b[..., 0:128].reshape(*lead, 2, 1, 64)  # 2 halves of 128 values
    qh = b[..., 128:192].reshape(*lead, 2, 1, 32)
    low = ((ql >> np.array([0, 4], dtype=np.uint8)[:, None]) & 15).reshape(*lead, 2, 4, 32)
    high = ((qh >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3).reshape(*lead, 2, 4, 32)
    q = (low | (high << 4)).astype(np.int8).reshape(*lead, 256) - np.int8(32)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)
    return q, _half(b[..., 208:210])[..., None] * sc, None


_DECODERS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q4_K": _q4_k,
             "Q6_K": _q6_k}


def decode_blocks(raw: np.ndarray, kind: str, shape: tuple[int, int]) -> QuantizedWeight:
    """The ``[N, K]`` weight stored as ``raw`` (``[N, bytes]``: each row's blocks, as
    :meth:`~.file.GGUFFile.raw` gives them) of an :data:`EXACT` type, in the rows layout."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    scheme, group = EXACT[kind]
    n, k = shape
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    blocks = raw.reshape(n, k // block, size)
    q, scales, mins = _DECODERS[kind](blocks)

    def rows(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a).reshape(n, -1)).to(dtype)

    values = rows(q, torch.int8 if scheme == "int8" else torch.uint8)
    return QuantizedWeight(scheme, ROWS, (n, k), group, values, rows(scales, torch.float32),
                           None if mins is None else rows(mins, torch.float32))


def requantize(weight: torch.Tensor) -> QuantizedWeight:
    """A weight of a type without an exact form (its float32 values) as int8 in groups of
    :data:`REQUANTIZE_GROUP` (per row where K is not a multiple)."""
    k = weight.shape[1]
    return quantize_int8(weight, REQUANTIZE_GROUP if k % REQUANTIZE_GROUP == 0 else None)
