"""The data pattern every write of a workload carries (same bytes as pattern.c).

Nothing a workload writes is stored: the byte at file offset X written by op
`seq`, iteration `iter`, into file `file_id` of workload `wid` is a pure
function of (wid, file_id, seq, iter, X). The file is cut into 512-byte
chunks at offsets that are multiples of 512; the chunk at offset C is

    0  u32 magic  "pcD1"           16  u32 iter
    4  u32 wid                     20  u64 C (the chunk's file offset)
    8  u32 file_id                 28  u32 CRC32 of the 512 bytes, this field as 0
   12  u32 seq                     32  480 bytes of filler (60 little-endian u64)

all little-endian. Filler word i is mix64(k + (i+1)*GOLDEN) with
k = mix64(mix64(mix64(wid<<32|file_id) ^ (seq<<32|iter)) ^ C) and mix64 the
splitmix64 finaliser: counter-based, so any byte can be produced without the
ones before it. A write covering only part of a chunk writes those bytes of
the full chunk, which is why a torn or unaligned chunk is still checkable
byte by byte (`generate`), while a whole chunk identifies its writer by
itself (`decode_chunk`).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

CHUNK = 512
HEADER = struct.Struct("<4sIIIIQI")  # magic, wid, file_id, seq, iter, offset, crc
MAGIC = b"pcD1"
CRC_AT = 28
FILLER_WORDS = (CHUNK - HEADER.size) // 8
_FILLER = struct.Struct(f"<{FILLER_WORDS}Q")
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_STEPS = [i * _GOLDEN for i in range(1, FILLER_WORDS + 1)]


@dataclass(frozen=True)
class ChunkInfo:
    """Who wrote a chunk: the fields of its (CRC-valid) header."""

    wid: int
    file_id: int
    seq: int
    iter: int
    offset: int


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _chunk(wid: int, file_id: int, seq: int, it: int, offset: int) -> bytes:
    """The full 512-byte chunk op (seq, it) writes at aligned file offset OFFSET."""
    k = _mix(_mix(_mix((wid << 32) | file_id) ^ ((seq << 32) | it)) ^ offset)
    # _mix spelled out over the whole list: this is the oracle's hot path.
    zs = [(k + step) & _M64 for step in _STEPS]
    zs = [((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64 for z in zs]
    zs = [((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64 for z in zs]
    filler = _FILLER.pack(*[z ^ (z >> 31) for z in zs])
    head = HEADER.pack(MAGIC, wid, file_id, seq, it, offset, 0)
    crc = zlib.crc32(filler, zlib.crc32(head))
    return head[:CRC_AT] + struct.pack("<I", crc) + filler


def generate(wid: int, file_id: int, seq: int, iter: int, offset: int, length: int) -> bytes:
    """The LENGTH bytes op (seq, iter) writes at file offset OFFSET of file FILE_ID."""
    if length <= 0:
        return b""
    first = offset - offset % CHUNK
    out = bytearray()
    for c in range(first, offset + length, CHUNK):
        out += _chunk(wid, file_id, seq, iter, c)
    skip = offset - first
    return bytes(out[skip:skip + length])


def decode_chunk(chunk: bytes) -> ChunkInfo | None:
    """The writer of a whole 512-byte chunk, or None (zeros, torn, foreign data)."""
    if len(chunk) != CHUNK or chunk[:4] != MAGIC:
        return None
    _, wid, file_id, seq, it, offset, crc = HEADER.unpack_from(chunk)
    if zlib.crc32(chunk[CRC_AT + 4:], zlib.crc32(chunk[:CRC_AT] + b"\0\0\0\0")) != crc:
        return None
    return ChunkInfo(wid, file_id, seq, it, offset)


def chunk_matches(chunk: bytes, wid: int, file_id: int, seq: int, iter: int, offset: int) -> bool:
    """Whether CHUNK (any length, read at file offset OFFSET) is exactly what op (seq, iter) wrote there."""
    return bytes(chunk) == generate(wid, file_id, seq, iter, offset, len(chunk))


# -- bulk: every chunk of a file at once ------------------------------------------
# The header fields as one numpy record per 512-byte chunk (same layout as HEADER).
_HEAD_DTYPE = np.dtype({"names": ["magic", "wid", "file_id", "seq", "iter", "offset", "crc"],
                        "formats": ["<u4", "<u4", "<u4", "<u4", "<u4", "<u8", "<u4"],
                        "offsets": [0, 4, 8, 12, 16, 20, 28], "itemsize": CHUNK})
_MAGIC_U32 = struct.unpack("<I", MAGIC)[0]
_NO_CRC = b"\0\0\0\0"


@dataclass
class ChunkScan:
    """What every whole chunk of a file's bytes is: all zeros, a valid pattern chunk
    (magic and CRC right: then `heads` names its writer), or neither."""

    data: bytes
    zero: np.ndarray    # bool per whole chunk
    valid: np.ndarray   # bool per whole chunk: decode_chunk would return its header
    heads: np.ndarray   # _HEAD_DTYPE per whole chunk (meaningful where valid)

    @property
    def n(self) -> int:
        return len(self.zero)


def _crc_ok(data: bytes, indices: np.ndarray) -> np.ndarray:
    """CRC check of the chunks at INDICES (only the ones with the magic are passed)."""
    view = memoryview(data)
    out = np.zeros(len(indices), dtype=bool)
    for k, c in enumerate(indices.tolist()):
        off = c * CHUNK
        got = int.from_bytes(view[off + CRC_AT:off + CRC_AT + 4], "little")
        head = zlib.crc32(_NO_CRC, zlib.crc32(view[off:off + CRC_AT]))
        out[k] = zlib.crc32(view[off + CRC_AT + 4:off + CHUNK], head) == got
    return out


def scan_chunks(data: bytes, previous: ChunkScan | None = None) -> ChunkScan:
    """ChunkScan of DATA's whole chunks. With PREVIOUS (a scan of an earlier version
    of the same file), chunks whose bytes did not change keep their verdict, so
    only changed chunks cost Python work (their CRC)."""
    if previous is not None and previous.data == data:  # the usual case: a file no write touched
        return previous
    n = len(data) // CHUNK
    words = np.frombuffer(data, dtype="<u8", count=n * CHUNK // 8).reshape(n, CHUNK // 8)
    heads = np.frombuffer(data, dtype=_HEAD_DTYPE, count=n)
    valid = np.zeros(n, dtype=bool)
    zero = np.zeros(n, dtype=bool)
    same = np.zeros(n, dtype=bool)
    if previous is not None and previous.n:
        m = min(n, previous.n)
        old = np.frombuffer(previous.data, dtype="<u8", count=m * CHUNK // 8).reshape(m, CHUNK // 8)
        same[:m] = (words[:m] == old).all(axis=1)
        valid[:m][same[:m]] = previous.valid[:m][same[:m]]
        zero[:m][same[:m]] = previous.zero[:m][same[:m]]
    changed = np.flatnonzero(~same)
    if len(changed):
        zero[changed] = ~words[changed].any(axis=1)
        todo = changed[~zero[changed] & (heads["magic"][changed] == _MAGIC_U32)]
        valid[todo] = _crc_ok(data, todo)
    return ChunkScan(data, zero, valid, heads)
