"""Sparse file copies: only the data extents are copied, holes stay holes."""

from __future__ import annotations

import errno
import os


def data_extents(fd: int, size: int, start: int = 0) -> list[tuple[int, int]]:
    """(offset, length) of every data region of FD in [start, size), via SEEK_DATA/SEEK_HOLE."""
    out = []
    pos = start
    while pos < size:
        try:
            begin = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole remains
                break
            raise
        if begin >= size:
            break
        end = min(os.lseek(fd, begin, os.SEEK_HOLE), size)
        out.append((begin, end - begin))
        pos = end
    return out


def copy_range(src_fd: int, dst_fd: int, src_offset: int, length: int, dst_offset: int) -> None:
    """Copy the data regions of SRC[src_offset, +length) to DST at dst_offset.

    Holes are skipped, not written: DST must already read as zeros there.
    """
    for off, n in data_extents(src_fd, src_offset + length, src_offset):
        done = 0
        while done < n:
            c = os.copy_file_range(src_fd, dst_fd, n - done, off + done, dst_offset + off - src_offset + done)
            if c == 0:
                break
            done += c


def sparse_copy(src: str, dst_fd: int) -> None:
    """Make the already open DST_FD an exact sparse copy of SRC."""
    with open(src, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        os.ftruncate(dst_fd, 0)
        os.ftruncate(dst_fd, size)
        copy_range(f.fileno(), dst_fd, 0, size, 0)
