"""The disk tier's file format: one file per KV block, self-checking.

``header | token ids (int32 little-endian) | payload``. The header carries a magic, the format
version, the block's token count and chained digest, the payload's length and a CRC-32 over
the header fields, the token ids and the payload. :func:`decode_block` returns the payload only
when all of it checks out against what the caller expects (digest, tokens, length); anything
else (truncated, corrupt, another format or another block) raises :class:`BlockFileError`,
which the tier treats as a miss.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from hermes_async.cache.digest import DIGEST_SIZE

MAGIC = b"HKVB"
VERSION = 1
SUFFIX = ".kv"
_HEADER = struct.Struct(f"<4sIIQI{DIGEST_SIZE}s")  # magic, version, tokens, payload, crc, digest


class BlockFileError(ValueError):
    """A block file that does not hold the block it should (a miss, never a wrong answer)."""


def file_size(num_tokens: int, payload_bytes: int) -> int:
    """Bytes of a block file of ``num_tokens`` tokens and ``payload_bytes`` of KV."""
    return _HEADER.size + 4 * num_tokens + payload_bytes


def _crc(num_tokens: int, payload_len: int, digest: bytes, tokens: bytes,
         payload: bytes | memoryview) -> int:
    crc = zlib.crc32(struct.pack("<IQ", num_tokens, payload_len) + digest)
    crc = zlib.crc32(tokens, crc)
    return zlib.crc32(payload, crc)


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(token_ids)}i", *token_ids)


def encode_block(digest: bytes, token_ids: Sequence[int],
                 payload: bytes | memoryview) -> list[bytes | memoryview]:
    """The parts of a block file, in order (for ``os.writev``)."""
    tokens = _token_bytes(token_ids)
    crc = _crc(len(token_ids), len(payload), digest, tokens, payload)
    header = _HEADER.pack(MAGIC, VERSION, len(token_ids), len(payload), crc, digest)
    return [header, tokens, payload]


def decode_block(data: bytes, digest: bytes, token_ids: Sequence[int],
                 payload_bytes: int) -> memoryview:
    """The payload of a block file, checked to be exactly the expected block."""
    if len(data) < _HEADER.size:
        raise BlockFileError(f"truncated header ({len(data)} bytes)")
    magic, version, n, length, crc, stored = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise BlockFileError(f"not a version {VERSION} block file")
    if stored != digest:
        raise BlockFileError("the file holds another block (digest differs)")
    if n != len(token_ids) or length != payload_bytes:
        raise BlockFileError(f"{n} tokens and {length} payload bytes, expected "
                             f"{len(token_ids)} and {payload_bytes}")
    if len(data) != file_size(n, length):
        raise BlockFileError(f"{len(data)} bytes, expected {file_size(n, length)} (truncated?)")
    start = _HEADER.size
    tokens = data[start:start + 4 * n]
    view = memoryview(data)[start + 4 * n:]
    if _crc(n, length, digest, tokens, view) != crc:
        raise BlockFileError("checksum mismatch")
    if tokens != _token_bytes(token_ids):
        raise BlockFileError("the file's token ids differ from the prompt's block")
    return view
