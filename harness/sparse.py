"""Sparse file copies: only the data extents are copied, holes stay holes."""

from __future__ import annotations

import errno
import os


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """(offset, length) of every data region of FD, via SEEK_DATA/SEEK_HOLE."""
    out = []
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole remains
                break
            raise
        end = os.lseek(fd, start, os.SEEK_HOLE)
        out.append((start, end - start))
        pos = end
    return out


def sparse_copy(src: str, dst_fd: int) -> None:
    """Make the already open DST_FD an exact sparse copy of SRC."""
    with open(src, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        os.ftruncate(dst_fd, 0)
        os.ftruncate(dst_fd, size)
        for off, length in data_extents(f.fileno(), size):
            done = 0
            while done < length:
                n = os.copy_file_range(f.fileno(), dst_fd, length - done, off + done, off + done)
                if n == 0:
                    break
                done += n
