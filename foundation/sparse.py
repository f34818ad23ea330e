"""Sparse files: holes for zeros, copies and comparisons that skip holes."""

from __future__ import annotations

import ctypes
import errno
import os

from foundation.intervals import merge_ranges

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


def reserve(fd: int, offset: int, length: int) -> bool:
    """Allocate [offset, offset+length) keeping the file's size; False where that is unsupported."""
    return _libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0


def is_zero(data: bytes | bytearray | memoryview) -> bool:
    view = memoryview(data)
    return all(_ZEROS.startswith(view[i:i + _ZERO_CHUNK]) for i in range(0, len(view), _ZERO_CHUNK))


def pwrite_sparse(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write DATA at OFFSET, as a hole if it is all zeros (same content, less to compare later)."""
    if is_zero(data):
        punch_hole(fd, offset, len(data))
    else:
        os.pwrite(fd, data, offset)


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


def _copy_data(src_fd: int, dst_fd: int, off: int, n: int, dst_offset: int) -> None:
    """Copy SRC[off, +n) to DST at dst_offset, in the kernel where it can."""
    done = 0
    while done < n:
        src_at, dst_at = off + done, dst_offset + done
        try:
            c = os.copy_file_range(src_fd, dst_fd, n - done, src_at, dst_at)
        except OSError as e:
            if e.errno != errno.EXDEV:  # kernels before 5.19 copy nothing across file systems
                raise
            data = os.pread(src_fd, min(n - done, 1 << 20), src_at)
            c = os.pwrite(dst_fd, data, dst_at) if data else 0
        if c == 0:
            break
        done += c


def copy_range(src_fd: int, dst_fd: int, src_offset: int, length: int, dst_offset: int) -> None:
    """Copy the data regions of SRC[src_offset, +length) to DST at dst_offset.

    Holes are skipped, not written: DST must already read as zeros there.
    """
    for off, n in data_extents(src_fd, src_offset + length, src_offset):
        _copy_data(src_fd, dst_fd, off, n, dst_offset + off - src_offset)


def mirror_range(src_fd: int, dst_fd: int, start: int, end: int, dst_start: int | None = None) -> None:
    """Make DST[dst_start, +(end-start)) read as SRC[start, end) (DST_START: START by default):
    SRC's data regions copied in the kernel (no pass through user space), its holes punched
    into DST. SRC must be a regular file."""
    shift = 0 if dst_start is None else dst_start - start
    if end - start <= SMALL_MIRROR:
        _mirror_small(src_fd, dst_fd, start, end, shift)
        return
    pos = start
    for off, n in data_extents(src_fd, end, start):
        if off > pos:
            punch_hole(dst_fd, pos + shift, off - pos)
        _copy_data(src_fd, dst_fd, off, n, off + shift)
        pos = off + n
    if pos < end:
        punch_hole(dst_fd, pos + shift, end - pos)


# Ranges up to this size are read and written (all-zero chunks punched) rather than
# walked extent by extent: SEEK_HOLE from inside a long data region scans it to its
# end (tmpfs: page by page, ~5 ms for 500 MB here), far more than copying the range.
SMALL_MIRROR = 1 << 20
_SMALL_CHUNK = 64 * 1024


def _mirror_small(src_fd: int, dst_fd: int, start: int, end: int, shift: int) -> None:
    data = memoryview(os.pread(src_fd, end - start, start))
    for i in range(0, len(data), _SMALL_CHUNK):
        pwrite_sparse(dst_fd, data[i:i + _SMALL_CHUNK], start + shift + i)
    if start + len(data) < end:   # past the source's end: zeros
        punch_hole(dst_fd, start + shift + len(data), end - start - len(data))


def sparse_copy(src: str, dst_fd: int) -> None:
    """Make the already open DST_FD an exact sparse copy of SRC."""
    with open(src, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        os.ftruncate(dst_fd, 0)
        os.ftruncate(dst_fd, size)
        copy_range(f.fileno(), dst_fd, 0, size, 0)


SYNC_CHUNK = 64 * 1024


def _merged_chunks(extents: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """Extents widened to SYNC_CHUNK boundaries, sorted and merged: (start, end)."""
    return merge_ranges([(off - off % SYNC_CHUNK, min(size, -(-(off + n) // SYNC_CHUNK) * SYNC_CHUNK))
                         for off, n in extents])


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


def first_difference(a_fd: int, b_fd: int, size: int) -> int | None:
    """Offset of the first SYNC_CHUNK in which A and B (SIZE bytes each) differ, or None if equal.

    Holes read as zeros: only the data extents of either file are read.
    """
    for start, end in _merged_chunks(data_extents(a_fd, size) + data_extents(b_fd, size), size):
        for off in range(start, end, SYNC_CHUNK):
            n = min(SYNC_CHUNK, end - off)
            if os.pread(a_fd, n, off) != os.pread(b_fd, n, off):
                return off
    return None
