"""Write initramfs archives: the kernel's "newc" cpio format, optionally gzipped.

Written here rather than with cpio(1) so archives are deterministic (fixed
mtimes and inode numbers: the same inputs give the same bytes, which keeps
the initramfs cache key honest) and no extra host tool is needed.
"""

from __future__ import annotations

import gzip
import stat
from dataclasses import dataclass

TRAILER = "TRAILER!!!"


@dataclass(frozen=True)
class Member:
    path: str          # inside the archive, without a leading slash
    mode: int          # full st_mode (file type bits included)
    data: bytes = b""  # file content, or the target of a symlink


def file(path: str, data: bytes, executable: bool = False) -> Member:
    return Member(path, stat.S_IFREG | (0o755 if executable else 0o644), data)


def directory(path: str) -> Member:
    return Member(path, stat.S_IFDIR | 0o755)


def symlink(path: str, target: str) -> Member:
    return Member(path, stat.S_IFLNK | 0o777, target.encode())


def _pad(n: int) -> bytes:
    return b"\0" * (-n % 4)


def _header(ino: int, m: Member, name: bytes) -> bytes:
    fields = (ino, m.mode, 0, 0, 1, 0, len(m.data), 0, 0, 0, 0, len(name) + 1, 0)
    return b"070701" + b"".join(b"%08x" % f for f in fields)


def archive(members: list[Member]) -> bytes:
    """The uncompressed newc archive; parent directories must come before children."""
    out = bytearray()
    for ino, m in enumerate([*members, Member(TRAILER, 0)], start=1):
        name = m.path.lstrip("/").encode()
        hdr = _header(ino, m, name) + name + b"\0"
        out += hdr + _pad(len(hdr)) + m.data + _pad(len(m.data))
    return bytes(out)


def gzipped(members: list[Member]) -> bytes:
    # mtime=0: same content, same bytes (cache keys stay stable).
    return gzip.compress(archive(members), compresslevel=6, mtime=0)
