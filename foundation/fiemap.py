"""A file's extents (FIEMAP, Documentation/filesystems/fiemap.rst): where its bytes lie on the device."""

from __future__ import annotations

import fcntl
import struct

FS_IOC_FIEMAP = 0xC020660B
_HEAD = struct.Struct("=QQIIII")          # fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count, reserved
_EXTENT = struct.Struct("=QQQQQIIII")     # fe_logical, fe_physical, fe_length, 2 reserved, fe_flags, 3 reserved
MAX_EXTENTS = 4096

# Extents whose bytes are not simply the device's bytes at fe_physical: not yet
# placed (unknown, delalloc), transformed (encoded, encrypted), packed with
# other data (not aligned, inline, tail).
INDIRECT = 0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200 | 0x400
UNWRITTEN = 0x800  # reads as zeros whatever the device holds there
LAST = 0x1


def extents(fd: int) -> tuple[tuple[int, int, int, int], ...] | None:
    """(logical, physical, length, flags) of every extent of the open file FD, or
    None where FIEMAP does not give them (unsupported, too many extents)."""
    try:
        head = bytearray(_HEAD.pack(0, (1 << 64) - 1, 0, 0, 0, 0))
        fcntl.ioctl(fd, FS_IOC_FIEMAP, head)
        n = _HEAD.unpack(head)[3]
        if n > MAX_EXTENTS:
            return None
        buf = bytearray(_HEAD.pack(0, (1 << 64) - 1, 0, 0, n + 1, 0) + bytes(_EXTENT.size * (n + 1)))
        fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
    except OSError:
        return None
    got = _HEAD.unpack_from(buf)[3]
    out = []
    for i in range(got):
        logical, physical, length, _, _, flags, _, _, _ = _EXTENT.unpack_from(buf, _HEAD.size + i * _EXTENT.size)
        out.append((logical, physical, length, flags))
    if got and not out[-1][3] & LAST:
        return None  # the file grew extents between the two calls: not a consistent list
    return tuple(out)
