"""Q4_K blocks written from float32 (the ``gguf`` package dequantizes K-quants but does not
write them): 256 values per block in 8 sub-blocks of 32, each with a 6-bit scale and min under
the block's float16 ``d`` and ``dmin``; ``x = d * sc * q - dmin * m`` with 4-bit ``q``.

A plain min/max fit (llama.cpp searches for better scales); any valid encoding serves the
tests and benchmarks, which compare against the dequantization of what was written.
"""

from __future__ import annotations

import numpy as np

QK_K = 256
BLOCK_BYTES = 144


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """``rows`` (..., K) float32 with K % 256 == 0 -> uint8 (..., K // 256 * 144)."""
    shape = rows.shape
    x = rows.astype(np.float32).reshape(-1, 8, 32)
    lo = np.minimum(x.min(axis=-1), 0.0)
    hi = x.max(axis=-1)
    scale = (hi - lo) / 15.0
    d = (scale.max(axis=-1) / 63.0).astype(np.float16)
    dmin = ((-lo).max(axis=-1) / 63.0).astype(np.float16)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d32 > 0, np.rint(scale / d32), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dmin32 > 0, np.rint(-lo / dmin32), 0).clip(0, 63).astype(np.uint8)
        step = (d32 * sc.astype(np.float32))[..., None]
        offset = (dmin32 * mn.astype(np.float32))[..., None]
        q = np.where(step > 0, np.rint((x + offset) / step), 0).clip(0, 15).astype(np.uint8)
    n = x.shape[0]
    scales = np.empty((n, 12), dtype=np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    q = q.reshape(n, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(n, 128)
    blocks = np.concatenate([d.reshape(n, 1).view(np.uint8), dmin.reshape(n, 1).view(np.uint8),
                             scales, qs], axis=1)
    return blocks.reshape(*shape[:-1], shape[-1] // QK_K * BLOCK_BYTES)
