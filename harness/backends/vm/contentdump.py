"""The recovered tree as the guest kernel read it, rebuilt on the host for the content oracle.

Where the host kernel cannot mount the file system (f2fs here), the guest
writes each recovered image's tree into a dump region of the batch disk
(pc-dump.c, the record format is described there) and the host rebuilds
it as a directory: the same names, kinds, sizes, data (holes stay holes),
symlink targets, hard links (one inode, one host file: the link counts
match), user xattrs and, for the allocation checks, the mapped ranges
(fallocated, keeping the size). The oracle then reads that directory as
it reads a read-only host mount of the image: one interface, two sources.
A read that failed in the guest (a damaged image) is a `corruption`
finding, as the same read on a host mount would be.

What the rebuilt tree cannot show: FIEMAP on it fails (tmpfs), so the
allocation check counts allocated blocks instead of matching ranges; inode
numbers are the host's (nothing in the oracle compares them with the guest's).
"""

from __future__ import annotations

import os
import shutil
import stat
import struct

from checkers.findings import Finding, read_error
from foundation import sparse
from foundation.errors import EnvError

MAGIC = b"PCDUMP1\0"
_NODE = struct.Struct("<QIIQ")   # ino, mode, nlink, size
_RANGE = struct.Struct("<QQ")


def read_region(fd: int, at: int, length: int) -> bytes:
    """The dump region (the guest wrote at most LENGTH bytes there)."""
    return os.pread(fd, length, at)


def rebuild(dump: bytes, root: str) -> list[Finding]:
    """Rebuild DUMP's tree under ROOT (emptied first); the reads that failed in the guest, as
    `corruption` findings (evidence `path`: relative to the image's root)."""
    if not dump.startswith(MAGIC):
        raise EnvError("the recovery guest wrote no dump of this image (pc-recover without PC_DUMP_BYTES?)")
    _empty(root)
    failed: list[Finding] = []
    first_path: dict[int, str] = {}   # guest inode -> the host file of its first name
    path = ""
    full = root
    fd: int | None = None
    pos, end = len(MAGIC), len(dump)
    try:
        while True:
            if pos + 5 > end:
                raise EnvError("the dump of a recovered image did not fit its region (the image holds more "
                               "than its size in file data?)")
            tag, length = chr(dump[pos]), struct.unpack_from("<I", dump, pos + 1)[0]
            body = dump[pos + 5:pos + 5 + length]
            pos += 5 + length
            if tag == "Z":
                return failed
            if tag == "N":
                if fd is not None:
                    os.close(fd)
                    fd = None
                ino, mode, nlink, size = _NODE.unpack_from(body)
                path = body[_NODE.size:].decode("utf-8", "surrogateescape")
                full = os.path.join(root, path) if path else root
                fd = _make(full, ino, mode, size, first_path)
            elif tag == "L":
                os.symlink(body, full.encode("utf-8", "surrogateescape"))
            elif tag == "D" and fd is not None:
                os.pwrite(fd, body[8:], struct.unpack_from("<Q", body)[0])
            elif tag == "M" and fd is not None:
                start, n = _RANGE.unpack(body)
                sparse.reserve(fd, start, n)
            elif tag == "X":
                nlen = struct.unpack_from("<H", body)[0]
                name = body[2:2 + nlen].decode("utf-8", "surrogateescape")
                if name.startswith("user."):  # the only ones the oracle reads (and tmpfs keeps)
                    os.setxattr(full, name, body[2 + nlen:], follow_symlinks=False)
            elif tag == "E":
                code, plen = struct.unpack_from("<IH", body)
                where = body[6:6 + plen].decode("utf-8", "surrogateescape")
                what = body[6 + plen:].decode()
                failed.append(read_error(OSError(code, f"{what}: {os.strerror(code)}"), root,
                                         where or "the root directory"))
    finally:
        if fd is not None:
            os.close(fd)


def judged_by_failures(findings: list[Finding], failed: list[Finding]) -> list[Finding]:
    """FINDINGS without those about a path whose read failed in the guest, or below one: on a host
    mount the oracle's own read of it fails there and the `corruption` finding is all it reports."""
    bad = [f.evidence["path"] for f in failed if f.evidence.get("path") not in (None, "the root directory")]
    if any(f.evidence.get("path") == "the root directory" for f in failed):
        return []

    def about_bad(f: Finding) -> bool:
        p = f.evidence.get("path")
        return isinstance(p, str) and any(p == b or p.startswith(b + "/") for b in bad)
    return [f for f in findings if not about_bad(f)]


def _make(full: str, ino: int, mode: int, size: int, first_path: dict[int, str]) -> int | None:
    """Create one node; an open fd for a new regular file (its data follows)."""
    if stat.S_ISDIR(mode):
        if not os.path.isdir(full):
            os.mkdir(full)
        return None
    if stat.S_ISREG(mode):
        if ino in first_path:  # another name of an inode already rebuilt
            os.link(first_path[ino], full)
            return None
        first_path[ino] = full
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(fd, size)
        return fd
    if stat.S_ISLNK(mode):
        return None  # made by the 'L' record that follows
    if ino in first_path:
        os.link(first_path[ino], full)
        return None
    first_path[ino] = full
    try:
        os.mknod(full, mode)
    except PermissionError:  # devices need root: the oracle only asks their kind
        os.mkfifo(full)
    return None


def _empty(root: str) -> None:
    for name in os.listdir(root):
        p = os.path.join(root, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)

