"""The vocabulary of generated workloads, shared by every generator.

Op sequences over a small file set (dirs A, B, A/C; files foo, bar in
them), offsets and lengths mostly small and 4 KiB aligned, sometimes
unaligned or large. `OpListBuilder` turns a stream of choices into a valid
op list (fds opened before use, closed at the end); where the choices come
from is the generator's business: Hypothesis draws (workloads/strategies.py),
AFL++ input bytes (workloads/opcodec.py). Every choice is made from *tiers*
listed simple-first: a generator picks a tier, then an item in it, so a
shrinker that moves toward the first tier and item moves toward short,
plain workloads.

Standard library only: AFL++'s custom mutator imports this with the
system Python, outside the venv.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

DIRS = ["A", "B", "A/C"]
PERSIST_DIRS = [".", "A", "B", "A/C"]   # fsync_dir: an fsync of a directory, the root first
FILES = ["foo", "A/foo", "A/bar", "B/foo", "bar", "A/C/foo"]
PATHS = FILES + DIRS
# Two names whose btrfs name hashes collide (crc32c with btrfs's seed: 0x538d8d1c), so the
# xattrs a workload sets share one packed item on btrfs: the path hash-collision fixes in
# btrfs's xattr and dir-item code live on. Names, not sequences: the generator still has to
# reach the ops that break there. Any other file system sees two ordinary names.
XATTRS = ["user.p1371838", "user.p2000402"]
MAX_FDS = 3

Tiers = Sequence[Sequence[Any]]

# Op kinds in tiers (a generator picks a tier, then a kind): data ops and what
# frees blocks (truncate, close, unlink) weigh most, that is where crash bugs
# are. The persistence ops (PERSIST_KINDS) come after ops on their own.
KIND_TIERS: Tiers = [["pwrite", "write", "ftruncate"],
                     ["close", "unlink", "open", "truncate", "rename", "fallocate", "mmap_write", "link",
                      "pwritev2", "copy_file_range", "clone"],
                     ["mkdir", "rmdir", "symlink", "setxattr", "removexattr", "syncfs", "sync_file_range",
                      "read", "pread", "statx", "tmpfile", "fsetxattr"],
                     # Namespace ops once more, in a tier of their own: a namespace op followed by
                     # an fsync of the file or of its directory is the shape xfstests' power-failure
                     # tests check most (docs/semantics.md), so they weigh as much as data ops.
                     ["rename", "link", "unlink", "symlink", "mkdir", "rmdir", "linkat"]]
# On xfs with exchange-range (mkfs -i exchange=1), XFS_IOC_EXCHANGE_RANGE joins the data
# ops' tier: it is how applications there replace a file's contents atomically
# (ioctl_xfs_exchange_range(2): write the new contents into a temporary file or a clone,
# then exchange). Other file systems keep KIND_TIERS as they are (kind_tiers).
EXCHANGE_KIND_TIERS: Tiers = [[*KIND_TIERS[0], "exchange_range"], *KIND_TIERS[1:]]
# On f2fs, a batch of atomic writes (F2FS_IOC_START_ATOMIC_WRITE, pwrites, COMMIT or ABORT
# on one fd: what SQLite does on Android for each transaction) joins the data ops' tier as
# one kind, f2fs_atomic; no other file system has the ioctls, so no other draws it.
NAMESPACE_KINDS = frozenset(KIND_TIERS[-1])
PERSIST_KINDS = ["fsync", "fdatasync", "sync", "fsync_dir"]
# The persistence op after a namespace op (a record's byte 2, modulo its length; 0 none,
# 1-4 as PERSIST_KINDS, so records that name one keep meaning it): fsync of the file or of
# its directory three times in four.
PERSIST_AFTER_NAMESPACE = [None, "fsync", "fdatasync", "sync", "fsync_dir", "fsync_dir", "fsync", "fsync_dir"]
FD_KINDS = {"pwrite", "fsync", "close", "write", "fdatasync", "ftruncate", "fallocate", "syncfs",
            "sync_file_range", "mmap_write", "read", "pread", "pwritev2", "linkat", "copy_file_range", "clone",
            "exchange_range", "fsetxattr"}
# copy_file_range(2) and reflink clones (ioctl_ficlone(2)) between two open files: the
# whole file (FICLONE) first, then block-aligned ranges (length 0: to the source's end);
# clones only where the file system shares extents (OpListBuilder.reflink), elsewhere
# the same choice is a copy_file_range.
CLONE_RANGES: Tiers = [[None], [(0, 0, 4096), (4096, 0, 4096), (0, 4096, 8192), (0, 16384, 0), (8192, 8192, 0)]]
COPY_OFFSETS: Tiers = [[0, 4096, 8192], range(0, 70001)]
# exchange_range (file1 offset, file2 offset, length; None: XFS_EXCHANGE_RANGE_TO_EOF): to EOF
# first, as applications update files with it (the whole file, or its tail from a block
# offset in either file), then ranges of a given length; offsets block-aligned (the ioctl
# requires it); DSYNC (durable on return) or not.
EXCHANGE_RANGES: Tiers = [[(0, 0, None), (0, 4096, None), (4096, 0, None), (4096, 4096, None)],
                          [(0, 0, 4096), (4096, 8192, 4096)]]
EXCHANGE_FLAGS: Tiers = [[[]], [["DSYNC"]]]
EXCHANGE_FILL = [8192, 4096, 16384]   # what the temporary file of an exchange gets first
ATOMIC_STARTS: Tiers = [["start"], ["replace"]]   # REPLACE: Linux 6.3+
ATOMIC_ENDS: Tiers = [["commit", "commit", "commit", "abort"]]
ATOMIC_WRITES: Tiers = [[1, 2, 3]]                # pwrites in a batch
ATOMIC_OFFSETS: Tiers = [[0, 4096, 8192, 16384], range(0, 70001)]
ATOMIC_LENGTHS: Tiers = [[4096, 8192], [1000, 16384]]
FALLOC_MODES = [["KEEP_SIZE"], [], ["PUNCH_HOLE", "KEEP_SIZE"], ["ZERO_RANGE"], ["ZERO_RANGE", "KEEP_SIZE"],
                ["COLLAPSE_RANGE"], ["INSERT_RANGE"], ["UNSHARE_RANGE"]]  # unshare: copy-on-write on reflink xfs
OPEN_FLAGS = [["O_CREAT", "O_RDWR"], ["O_RDWR"], ["O_CREAT", "O_RDWR", "O_TRUNC"], ["O_CREAT", "O_RDWR", "O_APPEND"],
              ["O_CREAT", "O_RDWR", "O_SYNC"], ["O_CREAT", "O_RDWR", "O_DSYNC"], ["O_CREAT", "O_RDWR", "O_DIRECT"],
              ["O_CREAT", "O_EXCL", "O_RDWR"], ["O_RDONLY"]]
SYNC_FILE_RANGE_FLAGS = [["WAIT_BEFORE", "WRITE", "WAIT_AFTER"], ["WRITE"]]
SYMLINK_TARGETS = ["foo", "A/foo", "C/foo", "missing"]
# renameat2(2) flags, plain rename first: RENAME_NOREPLACE (create-if-absent, as apps that must
# not clobber do) and RENAME_EXCHANGE (atomic swap of two names, e.g. of a directory tree).
# RENAME_WHITEOUT is left out: it makes a whiteout device node for overlayfs, not an app's op.
RENAME_FLAGS: Tiers = [[[]], [["NOREPLACE"], ["EXCHANGE"]]]
# pwritev2: untorn (RWF_ATOMIC) writes first. Their sizes are powers of two
# inside the unit range statx reports where they work (xfs -m reflink=1 here:
# 4 KiB to 1 MiB), naturally aligned, on an O_DIRECT fd (one is opened, and
# its limits read with statx, when the fd picked is not); where the file
# system has none they fail (EOPNOTSUPP) and are recorded as such.
PWRITEV2_FLAGS: Tiers = [[["RWF_ATOMIC"], ["RWF_ATOMIC", "RWF_DSYNC"]],
                         [[], ["RWF_DSYNC"], ["RWF_SYNC"], ["RWF_APPEND"], ["RWF_NOWAIT"], ["RWF_HIPRI"]]]
ATOMIC_SIZES = [4096, 16384, 65536]
ATOMIC_SLOTS = [0, 1, 2, 3]       # offset = slot * size
IOVS: Tiers = [[[4096], [4096, 4096], [16384]], [[512, 1000], [1, 4095, 4096]]]
PWRITEV2_OFFSETS: Tiers = [[0, 4096, 16384, -1], range(0, 70001)]
DIRECT = ["O_CREAT", "O_RDWR", "O_DIRECT"]

# Aligned small / unaligned / large (a large write followed by a delete is
# what exposes freed blocks as stale data).
LENGTHS: Tiers = [[4096, 8192, 16384, 65536], [1, 512, 1000, 5000], [1 << 20]]
OFFSETS: Tiers = [[0, 4096, 8192, 16384, 65536], range(0, 70001)]
TRUNCATE_LENGTHS: Tiers = [[0, 4096, 3000, 100000]]
SFR_LENGTHS: Tiers = [[0, 4096, 65536]]
# setxattr (value length, count): one xattr, or hundreds of 1 KiB on one file (what Samba,
# Ceph and backup tools keep per file): an attr tree of its own (xfs: node format).
XATTR_SIZES: Tiers = [[(8, 1), (100, 1)], [(1024, 400)]]
# fsetxattr(2) on an open file: XATTR_CREATE (set only if absent: a lock or a tag written
# once) and XATTR_REPLACE (update only if present) first, then no flag.
FSETXATTR_FLAGS: Tiers = [[["CREATE"], ["REPLACE"]], [[]]]


def kind_tiers(exchange: bool, atomic: bool = False) -> Tiers:
    """The op kind tiers of a file system that has exchange_range (EXCHANGE) or not, and
    f2fs atomic writes (ATOMIC) or not."""
    tiers = EXCHANGE_KIND_TIERS if exchange else KIND_TIERS
    return [[*tiers[0], "f2fs_atomic"], *tiers[1:]] if atomic else tiers


def one(items: Sequence[Any]) -> Tiers:
    """A single tier."""
    return [items]


class Picker(Protocol):
    def __call__(self, tiers: Tiers) -> Any:
        """One item of one of TIERS."""


class OpListBuilder:
    """Builds a valid op list from choices: an fd op with no fd open becomes
    an open, at most MAX_FDS fds are open, every fd is closed at the end."""

    def __init__(self, reflink: bool = True, exchange: bool = False, atomic: bool = False) -> None:
        self.reflink = reflink            # the file system clones: else a clone is drawn as a copy_file_range
        self.exchange = exchange          # and exchanges ranges: else an exchange is drawn as a clone
        self.atomic = atomic              # and has f2fs atomic writes: else a batch is drawn as a pwrite
        self.ops: list[dict[str, Any]] = []
        self.fds: list[str] = []
        self.last_fd: str | None = None   # the fd the last fd op used: persist / reuse it first
        self.opened: list[str] = []       # paths opened so far: unlink / truncate / rename those first
        self.direct: dict[str, str] = {}  # O_DIRECT fds -> their paths
        self.fd_path: dict[str, str] = {}  # fd -> the path it was opened with
        self.touched: list[str] = []      # the paths the last namespace op used (persist those first)
        self.last_ns = ""                 # and its kind
        self._next_fd = 0

    def _fd_tiers(self, persist: bool = False) -> Tiers:
        """Fds to pick from, likeliest first: for a persistence op after a namespace op,
        the fds open on a path it used (the renamed, linked or unlinked file); then the
        fd the last fd op used; then any."""
        tiers: list[list[str]] = []
        if persist and self.touched:
            tiers.append([f for f in self.fds if self.fd_path.get(f) in self.touched])
        if self.last_fd in self.fds:
            tiers.append([self.last_fd])
        tiers.append(self.fds)
        return [t for t in tiers if t]

    def _dir_tiers(self) -> Tiers:
        """Directories to fsync: after a namespace op, those holding the names it used."""
        near = sorted({os.path.dirname(p) or "." for p in self.touched} & set(PERSIST_DIRS))
        return [near, PERSIST_DIRS] if near else [PERSIST_DIRS]

    def _path_tiers(self, paths: list[str]) -> Tiers:
        return [self.opened, paths] if self.opened else [paths]

    def add(self, kind: str, pick: Picker) -> None:
        if kind == "fsync_dir":  # open the directory read-only, fsync it, close it
            name = f"f{self._next_fd}"
            self._next_fd += 1
            self.ops += [{"op": "open", "path": pick(self._dir_tiers()), "flags": ["O_RDONLY"], "fd": name},
                         {"op": "fsync", "fd": name}, {"op": "close", "fd": name}]
            return
        unreached = not any(self.fd_path.get(f) in self.touched for f in self.fds)
        if kind in ("fsync", "fdatasync") and self.last_ns in ("rename", "link", "mkdir") and unreached \
                and len(self.fds) < MAX_FDS:
            # No fd on what the namespace op just changed: open it by its new name (a file or a
            # directory, read-only: enough to fsync it) and persist that.
            self.open(self.touched[-1], ["O_RDONLY"])
        if kind == "tmpfile":  # open(O_TMPFILE) in a directory: a file with no name, until linkat
            if len(self.fds) < MAX_FDS:
                name = self.last_fd = f"f{self._next_fd}"
                self._next_fd += 1
                self.ops.append({"op": "open", "path": pick(one(PERSIST_DIRS)), "flags": ["O_TMPFILE", "O_RDWR"],
                                 "fd": name})
                self.fds.append(name)
            return
        if kind == "exchange_range" and not self.exchange:
            kind = "clone"
        if kind == "f2fs_atomic":
            if self.atomic:
                self.atomic_batch(pick)
                return
            kind = "pwrite"
        if kind == "clone" and not self.reflink:
            kind = "copy_file_range"
        if kind in ("copy_file_range", "clone", "exchange_range"):
            self.copy(kind, pick)
            return
        if kind in FD_KINDS and not self.fds:
            kind = "open"
        if kind == "open":
            if len(self.fds) < MAX_FDS:
                self.open(pick(self._path_tiers(FILES)), pick(one(OPEN_FLAGS)))
            return
        op: dict[str, Any] = {"op": kind}
        if kind in FD_KINDS:
            op["fd"] = self.last_fd = pick(self._fd_tiers(persist=kind in PERSIST_KINDS))
        if kind == "close":
            self.fds.remove(op["fd"])
        elif kind in ("pwrite", "pread", "mmap_write"):
            op.update(offset=pick(OFFSETS), length=pick(LENGTHS))
            if kind == "mmap_write":
                op["msync"] = pick(one([False, True]))
        elif kind in ("write", "read"):
            op["length"] = pick(LENGTHS)
        elif kind == "fallocate":
            op.update(mode=pick(one(FALLOC_MODES)), offset=pick(OFFSETS), length=pick(LENGTHS))
        elif kind == "sync_file_range":
            op.update(offset=pick(OFFSETS), length=pick(SFR_LENGTHS), flags=pick(one(SYNC_FILE_RANGE_FLAGS)))
        elif kind in ("ftruncate", "truncate"):
            op["length"] = pick(TRUNCATE_LENGTHS)
            if kind == "truncate":
                op["path"] = pick(self._path_tiers(FILES))
        elif kind in ("rename", "link"):
            op.update({"from": pick(self._path_tiers(PATHS)), "to": pick(one(PATHS))})
            flags = pick(RENAME_FLAGS) if kind == "rename" else []
            if flags:
                op["flags"] = flags
        elif kind == "symlink":
            op.update(target=pick(one(SYMLINK_TARGETS)), path=pick([FILES, DIRS]))
        elif kind == "unlink":
            op["path"] = pick(self._path_tiers(FILES))
        elif kind == "linkat":  # name the fd's file (a tmpfile, or one renamed or unlinked since)
            op["to"] = pick(one(FILES))
        elif kind in ("mkdir", "rmdir"):
            op["path"] = pick([DIRS, FILES])  # a file's name reused as a directory too
        elif kind == "setxattr":
            op.update(path=pick(one(PATHS)), name=pick(one(XATTRS)))
            op["length"], count = pick(XATTR_SIZES)
            if count > 1:
                op["count"] = count
        elif kind == "fsetxattr":
            op.update(name=pick(one(XATTRS)), length=pick(one([8, 100])), flags=pick(FSETXATTR_FLAGS))
        elif kind == "removexattr":
            op.update(path=pick(one(PATHS)), name=pick(one(XATTRS)))
        elif kind == "statx":
            op["path"] = pick(self._path_tiers(FILES))
        elif kind == "pwritev2":
            self.pwritev2(op, pick)
        if kind in NAMESPACE_KINDS:
            self.touched = [op[k] for k in ("from", "to", "path") if k in op]
            self.last_ns = kind
        elif kind not in PERSIST_KINDS:
            self.touched, self.last_ns = [], ""
        self.ops.append(op)

    def copy(self, kind: str, pick: Picker) -> None:
        """A copy, clone or exchange between two open files (a second one is opened when
        only one is): the destination becomes the fd the next persistence op picks."""
        if kind == "exchange_range":  # its own choices first: the record's bytes run out
            off1, off2, length = pick(EXCHANGE_RANGES)
            flags = (["TO_EOF"] if length is None else []) + pick(EXCHANGE_FLAGS)
            self.exchange_files(pick)
        elif len(self.fds) < 2 and len(self.fds) < MAX_FDS:
            self.open(pick(self._path_tiers(FILES)), ["O_CREAT", "O_RDWR"])
        if not self.fds:
            return
        dst = pick(self._fd_tiers())
        others = [f for f in self.fds if f != dst]
        src = pick(one(others)) if others else dst
        op: dict[str, Any] = {"op": kind, "from_fd": src, "fd": dst}
        if kind == "copy_file_range":
            op.update(from_offset=pick(COPY_OFFSETS), offset=pick(COPY_OFFSETS), length=pick(LENGTHS))
        elif kind == "exchange_range":  # file1 the other fd, file2 (the ioctl's) the one just used
            op.update(from_offset=off1, offset=off2, length=length or 0, flags=flags)
        else:
            rng = pick(CLONE_RANGES)
            if rng is not None:
                op.update(from_offset=rng[0], offset=rng[1], length=rng[2])
        self.last_fd = dst
        self.touched, self.last_ns = [], ""
        self.ops.append(op)

    def atomic_batch(self, pick: Picker) -> None:
        """An f2fs atomic batch on one fd, as SQLite writes a transaction: START (or REPLACE),
        a few pwrites, COMMIT (three times in four) or ABORT; nothing else on the file in between
        (checkers/f2fs_batches.py). Not on an O_DIRECT fd (the ioctl refuses it): a plain one
        is opened on its file instead."""
        start, writes, end = pick(ATOMIC_STARTS), pick(ATOMIC_WRITES), pick(ATOMIC_ENDS)
        fd = pick(self._fd_tiers()) if self.fds else None
        if fd is None or fd in self.direct:
            if len(self.fds) >= MAX_FDS:
                return
            fd = self.open(self.fd_path.get(fd or "", "") or pick(self._path_tiers(FILES)), ["O_CREAT", "O_RDWR"])
        self.ops.append({"op": "f2fs_atomic", "fd": fd, "action": start})
        for _ in range(writes):
            self.ops.append({"op": "pwrite", "fd": fd, "offset": pick(ATOMIC_OFFSETS), "length": pick(ATOMIC_LENGTHS)})
        self.ops.append({"op": "f2fs_atomic", "fd": fd, "action": end})
        self.last_fd = fd
        self.touched, self.last_ns = [], ""

    def exchange_files(self, pick: Picker) -> None:
        """Two files for an exchange, as applications update one atomically: a file that
        is not open yet (their temporary file) is opened and written (EXCHANGE_FILL bytes),
        until two fds are open."""
        while len(self.fds) < 2:
            last = self.last_fd
            free = [p for p in FILES if p not in {self.fd_path.get(f) for f in self.fds}]
            top = [p for p in free if "/" not in p]   # its directory exists: the root
            fd = self.open(pick(one(top or free)), ["O_CREAT", "O_RDWR"])
            self.ops.append({"op": "pwrite", "fd": fd, "offset": 0, "length": pick(one(EXCHANGE_FILL))})
            self.last_fd = last if last in self.fds else fd   # file2 stays the file used last

    def open(self, path: str, flags: list[str]) -> str:
        name = self.last_fd = f"f{self._next_fd}"
        self._next_fd += 1
        self.ops.append({"op": "open", "path": path, "flags": flags, "fd": name})
        self.fds.append(name)
        self.fd_path[name] = path
        self.opened.append(path)
        if "O_DIRECT" in flags:
            self.direct[name] = path
        return name

    def pwritev2(self, op: dict[str, Any], pick: Picker) -> None:
        flags = pick(PWRITEV2_FLAGS)
        if "RWF_ATOMIC" not in flags:
            op.update(iov=pick(IOVS), offset=pick(PWRITEV2_OFFSETS), flags=flags)
            return
        if op["fd"] not in self.direct and len(self.fds) < MAX_FDS:
            path = self.opened[-1] if self.opened else FILES[0]
            op["fd"] = self.open(path, DIRECT)
            self.ops.append({"op": "statx", "path": path})
        size = pick(one(ATOMIC_SIZES))
        op.update(iov=[size], offset=size * pick(one(ATOMIC_SLOTS)), flags=flags)

    def finish(self) -> list[dict[str, Any]]:
        return self.ops + [{"op": "close", "fd": fd} for fd in self.fds]

