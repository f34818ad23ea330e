"""Sparse files: holes for zeros, copies and comparisons that skip holes."""

from __future__ import annotations

import ctypes
import errno
import os

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_ZERO_CHUNK = 1 << 20
_ZEROS = bytes(_ZERO_CHUNK)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Zero [offset, offset+length) by deallocating it; write zeros where that is unsupported."""
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return
    err = ctypes.get_errno()
    if err not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        raise OSError(err, os.strerror(err))
    end = offset + length
    while offset < end:
        offset += os.pwrite(fd, _ZEROS[: end - offset], offset)


def is_zero(data: bytes | bytearray | memoryview) -> bool:
    view = memoryview(data)
    return all(_ZEROS.startswith(view[i:i + _ZERO_CHUNK]) for i in range(0, len(view), _ZERO_CHUNK))


def pwrite_sparse(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write DATA at OFFSET, as a hole if it is all zeros (same content, less to compare later)."""
    if is_zero(data):
        punch_hole(fd, offset, len(data))
    else:
        os.pwrite(fd, data, offset)


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


SYNC_CHUNK = 64 * 1024


def _merged_chunks(extents: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """Extents widened to SYNC_CHUNK boundaries, sorted and merged: (start, end)."""
    spans = sorted((off - off % SYNC_CHUNK, min(size, -(-(off + n) // SYNC_CHUNK) * SYNC_CHUNK)) for off, n in extents)
    out: list[tuple[int, int]] = []
    for start, end in spans:
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def sync_sparse(src_fd: int, dst_fd: int, size: int) -> int:
    """Make DST equal to SRC (both SIZE bytes), rewriting only the chunks that differ.

    Only data extents of either file are compared (holes read as zeros on
    both sides), so the cost is their size, not the image size. A chunk that
    is zero in SRC becomes a hole in DST. Returns the number of chunks rewritten.
    """
    a, b = bytearray(SYNC_CHUNK), bytearray(SYNC_CHUNK)
    rewritten = 0
    for start, end in _merged_chunks(data_extents(src_fd, size) + data_extents(dst_fd, size), size):
        for off in range(start, end, SYNC_CHUNK):
            n = min(SYNC_CHUNK, end - off)
            if n < SYNC_CHUNK:  # the image's last, partial chunk
                a, b = bytearray(n), bytearray(n)
            os.preadv(src_fd, [a], off)
            os.preadv(dst_fd, [b], off)
            if a == b:
                continue
            rewritten += 1
            pwrite_sparse(dst_fd, a, off)
    return rewritten
