"""xfs's exchange-range feature with an xfsprogs that predates it.

XFS_IOC_EXCHANGE_RANGE (ioctl_xfs_exchange_range(2), Linux 6.10+) works only on
a file system whose superblock has the incompat feature bit
XFS_SB_FEAT_INCOMPAT_EXCHRANGE (1 << 6, fs/xfs/libxfs/xfs_format.h; the kernel
reads it in xfs_sb.c into XFS_FEAT_EXCHANGE_RANGE). mkfs.xfs sets it for
`-i exchange=1` from xfsprogs 6.10 on; Debian bookworm has xfsprogs 6.1, whose
mkfs.xfs rejects the option and whose xfs_repair refuses a superblock with the
bit ("unknown incompatible features").

So `-i exchange=1` with an older xfsprogs is done by hand: mkfs without it, then
xfs_db sets the bit (its write verifier refuses unknown bits: `write -d`
writes anyway and still updates the superblock CRC). The bit adds no on-disk
format besides two log item types (the exchange intent and its done item), which
log recovery has consumed once the recovery mount has unmounted cleanly; for
fsck the bit is cleared around the older xfs_repair and set again after it, so
the image is byte-identical before and after the check.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shlex
import struct
from collections.abc import Iterator

from foundation import sysres
from foundation.errors import EnvError

EXCHRANGE = 1 << 6          # XFS_SB_FEAT_INCOMPAT_EXCHRANGE
INCOMPAT_OFFSET = 216       # sb_features_incompat in struct xfs_dsb (big endian u32)
FIRST_VERSION = (6, 10)     # xfsprogs that knows the feature
OPTION = "exchange=1"


def wanted(mkfs_opts: str) -> bool:
    """Whether MKFS_OPTS ask for the exchange-range feature (`-i exchange=1`)."""
    return OPTION in re.split(r"[\s,]+", mkfs_opts)


def _version(tool: str) -> tuple[int, int]:
    out = sysres.run([tool, "-V"], check=False).stdout
    m = re.search(r"version (\d+)\.(\d+)", out or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


# The versions of the programs a run uses, not of the host's: with `--tools debian:SUITE`
# mkfs and xfs_repair are the suite's, and a newer mkfs.xfs sets the bit itself (sid's
# does by default), which a by-hand step around a newer xfs_repair would only undo on
# the primary superblock ("incompat feature mismatch in AG 1 super").
@functools.cache
def by_hand(mkfs: str = "mkfs.xfs") -> bool:
    """MKFS (mkfs.xfs) predates `-i exchange=1`: the bit is set with xfs_db."""
    return _version(mkfs) < FIRST_VERSION


@functools.cache
def repair_predates(repair: str = "xfs_repair") -> bool:
    """REPAIR (xfs_repair) refuses a superblock with the bit."""
    return _version(repair) < FIRST_VERSION


def strip(mkfs_opts: str) -> str:
    """MKFS_OPTS without exchange=1 (and without a `-i` left empty by that)."""
    words = shlex.split(mkfs_opts)
    out: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w == "-i" and i + 1 < len(words):
            subs = [s for s in words[i + 1].split(",") if s != OPTION]
            if subs:
                out += ["-i", ",".join(subs)]
            i += 2
            continue
        out.append(w)
        i += 1
    return shlex.join(out)


def _incompat(image: str) -> int:
    with open(image, "rb") as f:
        f.seek(INCOMPAT_OFFSET)
        return struct.unpack(">I", f.read(4))[0]


def _write_incompat(image: str, value: int, xfs_db: str = "xfs_db") -> None:
    p = sysres.run([xfs_db, "-x", "-c", "sb 0", "-c", f"write -d features_incompat {value:#x}", image],
                   check=False)
    if p.returncode != 0 or _incompat(image) != value:
        raise EnvError(f"xfs_db could not set the exchange-range feature on {image}: "
                       f"{(p.stderr or p.stdout).strip()}")


def set_bit(image: str, xfs_db: str = "xfs_db") -> None:
    """Turn the feature on in a freshly made file system (a device or an image)."""
    _write_incompat(image, _incompat(image) | EXCHRANGE, xfs_db)


def guest_mkfs(mkfs: str, mkfs_opts: str, xfs_db: str = "xfs_db") -> str:
    """A shell command for the guest that makes the file system on the device appended
    to it (record.sh: `eval "$PC_MKFS $dev"`), as set_bit does on the host."""
    made = f"{mkfs} {strip(mkfs_opts)}".strip()
    return ('pc_mkfs() { ' + made + ' "$1" && '
            f'v=$({xfs_db} -r -c "sb 0" -c "p features_incompat" "$1" | sed "s/.*= //") && '
            f'{xfs_db} -x -c "sb 0" -c "write -d features_incompat $((v | {EXCHRANGE}))" "$1"; }}; pc_mkfs')


@contextlib.contextmanager
def hidden_from_repair(image: str, repair: str = "xfs_repair", xfs_db: str = "xfs_db") -> Iterator[None]:
    """Around an xfs_repair (REPAIR) that predates the feature: the bit off, then on again."""
    if not repair_predates(repair) or not _incompat(image) & EXCHRANGE:
        yield
        return
    value = _incompat(image)
    _write_incompat(image, value & ~EXCHRANGE, xfs_db)
    try:
        yield
    finally:
        _write_incompat(image, value, xfs_db)
