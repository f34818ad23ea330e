"""Reading a recovered image's files, reusing what the previous inspection of the same worker read.

A file's content as read() returns it is fixed by its size, its extents
(FIEMAP: logical offset, device offset, length, flags) and the device's
bytes under those extents, once nothing of it is left dirty in the page
cache (the worker syncfs()es before inspecting, checkers/crashwalk/slot.py). So
when the inode number, the size and the extent list are those of the
previous inspection on this mount point and no device byte under an extent
changed since (checkers/crashwalk/devchanges.py), the bytes are those read then.
Anything else is read again: unknown changes, an extent whose bytes are not
the device's (inline, encoded, delalloc, ...), file systems whose FIEMAP
offsets are not device offsets (btrfs: logical addresses), FIEMAP refused.

Each distinct content gets a token (equal bytes, equal token, also when they
had to be read again), so that verdicts can be cached by token.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

from checkers.crashwalk.devchanges import DeviceChanges, since_last
from foundation import fiemap

# File systems whose FIEMAP fe_physical is a byte offset on the one device.
DEVICE_OFFSETS = frozenset({"ext4", "xfs"})


@dataclass
class _Memo:
    key: tuple[int, int, tuple[tuple[int, int, int, int], ...]]   # inode number, size, extents
    data: bytes
    token: int
    seq: int = -1   # the inspection of its mount that read it (its changes' seq)


@dataclass
class _Mount:
    slot: str = ""
    seq: int = -1
    changes: DeviceChanges | None = None
    files: dict[str, _Memo] = field(default_factory=dict)


class ImageFiles:
    def __init__(self, fs: str, enabled: bool = True) -> None:
        self.enabled = enabled and fs in DEVICE_OFFSETS
        self._mounts: dict[str, _Mount] = {}
        self._tokens = itertools.count()
        self._last: dict[str, _Memo] = {}   # path -> the last content read anywhere (token reuse)
        self.reused = 0       # files whose bytes were all reused, not read
        self.patched = 0      # files whose unchanged ranges were reused, the rest read
        self.read = 0         # files read whole
        self.bytes_read = 0   # bytes read from images (whole files and patches)

    def begin(self, mnt: str) -> None:
        """A new inspection of the image mounted at MNT: keep only what is still known to hold."""
        m = self._mounts.setdefault(mnt, _Mount())
        changes = since_last(mnt) if self.enabled else None
        if changes is None or not changes.follows(m.slot, m.seq):
            m.files.clear()
        else:
            # CHANGES cover only what changed since the previous inspection: a file not read
            # then was read before changes this mount's memo never saw (fsync-loop under
            # barrier=0: a data block rewritten between two inspections that skipped the file).
            for path in [p for p, memo in m.files.items() if memo.seq != m.seq]:
                del m.files[path]
        m.changes = changes
        m.slot, m.seq = (changes.slot, changes.seq) if changes else ("", -1)

    def content(self, mnt: str, path: str) -> tuple[bytes, int]:
        """PATH's bytes in the image mounted at MNT, and their token."""
        m = self._mounts.setdefault(mnt, _Mount())
        with open(os.path.join(mnt, path), "rb") as f:
            key = None
            if m.changes is not None and m.changes.ranges is not None:
                ext = fiemap.extents(f.fileno())
                if ext is not None and not any(e[3] & fiemap.INDIRECT for e in ext):
                    st = os.fstat(f.fileno())
                    key = (st.st_ino, st.st_size, ext)
            memo = m.files.get(path)
            if key is not None and memo is not None:
                assert m.changes is not None
                same = reusable(memo.key[2], key[2], min(memo.key[1], key[1]), m.changes)
                if memo.key == key and same == [(0, key[1])] or key[1] == 0 == memo.key[1]:
                    self.reused += 1
                    memo.seq = m.seq   # known to hold at this inspection too
                    return memo.data, memo.token
                data = self._patch(f.fileno(), memo.data, same, key[1])
            else:
                data = f.read()
                self.read += 1
                self.bytes_read += len(data)
        last = self._last.get(path)
        token = last.token if last is not None and (last.data is data or last.data == data) else next(self._tokens)
        memo = _Memo(key or (0, 0, ()), data, token, m.seq)
        self._last[path] = memo
        if key is not None:
            m.files[path] = memo
        else:
            m.files.pop(path, None)
        return data, token

    def _patch(self, fd: int, old: bytes, same: list[tuple[int, int]], size: int) -> bytes:
        """The file's SIZE bytes: OLD's where SAME says they still hold, read through the file elsewhere.
        Joined in one copy (a recording file of 16 MB patched at every state: a bytearray of OLD
        patched in place and then made bytes was two)."""
        parts: list[bytes | memoryview] = []
        view = memoryview(old)
        cur = 0
        for a, b in same + [(size, size)]:
            a, b = min(a, size), min(b, size)
            if a > cur:  # not known to be unchanged: read it
                got = os.pread(fd, a - cur, cur)
                if len(got) != a - cur:  # shorter than its size said: read it all the plain way
                    view.release()
                    self.bytes_read += size
                    return os.pread(fd, size, 0)
                parts.append(got)
                self.bytes_read += a - cur
            if b > max(a, cur):
                lo = max(a, cur)
                hi = min(b, len(old))
                if hi > lo:
                    parts.append(view[lo:hi])
                if b > hi:   # (past OLD's end: a hole in both, zeros)
                    parts.append(bytes(b - max(hi, lo)))
            cur = max(cur, b)
        out = b"".join(parts)
        parts.clear()
        view.release()
        self.patched += 1
        return out


def _pieces(ext: tuple[tuple[int, int, int, int], ...], end: int) -> list[tuple[int, int, int | None, int]]:
    """[0, END) cut by EXT into (lo, hi, device offset at lo or None for a hole, flags)."""
    out: list[tuple[int, int, int | None, int]] = []
    cur = 0
    for logical, phys, n, flags in ext:
        if logical >= end:
            break
        if logical > cur:
            out.append((cur, logical, None, 0))
        lo = max(logical, cur)
        hi = min(logical + n, end)
        if hi > lo:
            out.append((lo, hi, phys + (lo - logical), flags & fiemap.UNWRITTEN))
        cur = max(cur, hi)
    if cur < end:
        out.append((cur, end, None, 0))
    return out


def reusable(old: tuple[tuple[int, int, int, int], ...], new: tuple[tuple[int, int, int, int], ...], end: int,
             changes: DeviceChanges) -> list[tuple[int, int]]:
    """The ranges of [0, END) whose bytes are the same in a file mapped by OLD before and by
    NEW now: a hole in both, or the same device bytes (same offset, same unwritten flag)
    that no change touched. Merged, in order."""
    a, b = _pieces(old, end), _pieces(new, end)
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        pa, pb = a[i][2], b[j][2]
        if hi > lo:
            same: list[tuple[int, int]] = []
            if pa is None and pb is None:
                same = [(lo, hi)]
            elif pa is not None and pb is not None:
                da, db = pa + (lo - a[i][0]), pb + (lo - b[j][0])
                if da == db and a[i][3] == b[j][3]:  # the parts of these device bytes nothing changed
                    same = [(lo + s - db, lo + t - db) for s, t in changes.untouched(db, db + (hi - lo))]
            for s, t in same:
                if out and out[-1][1] == s:
                    out[-1] = (out[-1][0], t)
                else:
                    out.append((s, t))
        if a[i][1] == hi:
            i += 1
        if b[j][1] == hi:
            j += 1
    return out
