"""What the exported ops leave in the file system after each of them: the
expectation an export's checks (checks.py) are written from.

A small model of POSIX semantics for the ops an export runs (names, file
sizes and bytes, link counts, xattrs, fds held across unlink and rename),
with the bytes the exports write: op number I writes the byte 'a' + I % 26
(pc-repro.c and the fstests export's `pwrite -S` agree). states[k] is the
file system after the first k ops returned; a power cut right after op k
may show, for a fact a completed fsync covers, only what one of
states[g..k] shows (g: the op that made it durable).

An op the model cannot follow exactly (collapse and insert ranges shift
bytes; an unaligned O_DIRECT write fails or falls back to buffered I/O as
the file system decides) marks its inode inexact: no size or byte check is
written for it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any


def fill(i: int) -> int:
    """The byte op number I writes."""
    return ord("a") + i % 26


@dataclass
class Inode:
    kind: str                                  # file, dir, symlink
    data: bytearray = field(default_factory=bytearray)
    xattrs: dict[str, bytes] = field(default_factory=dict)
    target: str = ""
    exact: bool = True
    writers: set[int] = field(default_factory=lambda: {0})   # byte values ever in the file (0: holes, zeros)


@dataclass
class State:
    names: dict[str, int]        # path -> inode number
    inodes: dict[int, Inode]

    def kind(self, path: str) -> str:
        ino = self.names.get(path)
        return "absent" if ino is None else self.inodes[ino].kind

    def inode(self, path: str) -> Inode | None:
        ino = self.names.get(path)
        return None if ino is None else self.inodes[ino]

    def nlink(self, path: str) -> int:
        ino = self.names.get(path)
        return sum(1 for i in self.names.values() if i == ino)


@dataclass
class _Fd:
    ino: int
    pos: int
    read: bool
    write: bool
    append: bool
    direct: bool = False


class Model:
    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.inodes: dict[int, Inode] = {}
        self.fds: dict[str, _Fd] = {}
        self.next_ino = 1
        self.states: list[State] = [self.snapshot()]

    def snapshot(self) -> State:
        live = set(self.names.values()) | {f.ino for f in self.fds.values()}
        return State(dict(self.names), {i: copy.deepcopy(n) for i, n in self.inodes.items() if i in live})

    def run(self, ops: list[dict[str, Any]]) -> list[State]:
        for i, op in enumerate(ops):
            self.apply(i, op)
            self.states.append(self.snapshot())
        return self.states

    # -- names ---------------------------------------------------------------------
    def _parent_ok(self, path: str) -> bool:
        parent = path.rpartition("/")[0]
        return not parent or self.names.get(parent) is not None and self.inodes[self.names[parent]].kind == "dir"

    def _new(self, path: str, kind: str, **kw: Any) -> int:
        ino = self.next_ino
        self.next_ino += 1
        self.inodes[ino] = Inode(kind, **kw)
        self.names[path] = ino
        return ino

    def _children(self, path: str) -> list[str]:
        return [p for p in self.names if p.startswith(path + "/")]

    def _rename(self, src: str, dst: str, flags: list[str]) -> None:
        s, d = self.names.get(src), self.names.get(dst)
        if s is None or not self._parent_ok(dst) or src == dst:
            return
        if "EXCHANGE" in flags:
            if d is None:
                return
            moved = {p: self.names.pop(p) for p in [src, dst, *self._children(src), *self._children(dst)]}
            for p, ino in moved.items():
                if p == src or p.startswith(src + "/"):
                    self.names[dst + p[len(src):]] = ino
                else:
                    self.names[src + p[len(dst):]] = ino
            return
        if d is not None:
            sk, dk = self.inodes[s].kind, self.inodes[d].kind
            if "NOREPLACE" in flags or (sk == "dir") != (dk == "dir") or (dk == "dir" and self._children(dst)):
                return
        if dst.startswith(src + "/"):
            return
        for p in [src, *self._children(src)]:
            self.names[dst + p[len(src):]] = self.names.pop(p)

    # -- bytes ---------------------------------------------------------------------
    @staticmethod
    def _write(ino: Inode, off: int, data: bytes) -> None:
        if len(ino.data) < off:
            ino.data.extend(bytes(off - len(ino.data)))
        ino.data[off:off + len(data)] = data
        ino.writers |= set(data[:1])

    @staticmethod
    def _resize(ino: Inode, size: int) -> None:
        if size < len(ino.data):
            del ino.data[size:]
        else:
            ino.data.extend(bytes(size - len(ino.data)))

    def _fd_write(self, i: int, fd: _Fd | None, off: int | None, length: int) -> None:
        if fd is None or not fd.write:
            return
        ino = self.inodes[fd.ino]
        at = len(ino.data) if fd.append else (fd.pos if off is None or off < 0 else off)
        if fd.direct and (at % 4096 or length % 4096):
            # Unaligned O_DIRECT: EINVAL, a buffered fallback (ext4), part of it: the file system's call
            ino.exact = False
            return
        self._write(ino, at, bytes([fill(i)]) * length)
        if off is None or off < 0:
            fd.pos = at + length

    def _copy(self, src: _Fd | None, dst: _Fd | None, s_off: int, d_off: int, length: int) -> None:
        """copy_file_range(2): the source's bytes, cut at its end; nothing for the errors
        (an fd without read or write access, O_APPEND, a directory, overlap in one file)."""
        if src is None or dst is None or not src.read or not dst.write or dst.append:
            return
        a, b = self.inodes[src.ino], self.inodes[dst.ino]
        data = bytes(a.data[s_off:s_off + length])
        if "file" != a.kind or "file" != b.kind or (a is b and d_off < s_off + len(data) and s_off < d_off + len(data)):
            return
        if data:
            self._write(b, d_off, data)
            b.writers |= a.writers
            b.exact = b.exact and a.exact

    def apply(self, i: int, op: dict[str, Any]) -> None:
        k = op["op"]
        fd = self.fds.get(op.get("fd", ""))
        if k in ("open", "creat"):
            flags = ["O_CREAT", "O_WRONLY", "O_TRUNC"] if k == "creat" else op["flags"]
            ino_n = self.names.get(op["path"])
            if ino_n is None:
                if "O_CREAT" not in flags or not self._parent_ok(op["path"]):
                    return
                ino_n = self._new(op["path"], "file")
            elif "O_CREAT" in flags and "O_EXCL" in flags:
                return
            ino = self.inodes[ino_n]
            write = "O_WRONLY" in flags or "O_RDWR" in flags
            if ino.kind == "symlink" or (ino.kind == "dir" and (write or "O_CREAT" in flags)):
                return  # symlinks are followed by open(2); the workloads' never resolve: an error either way
            if "O_TRUNC" in flags and write:
                self._resize(ino, 0)
            self.fds[op["fd"]] = _Fd(ino_n, 0, "O_WRONLY" not in flags, write, "O_APPEND" in flags,
                                     "O_DIRECT" in flags)
        elif k == "close":
            self.fds.pop(op["fd"], None)
        elif k == "write":
            self._fd_write(i, fd, None, op["length"])
        elif k == "pwrite":
            self._fd_write(i, fd, op["offset"], op["length"])
        elif k == "pwritev2":
            self._fd_write(i, fd, op.get("offset", -1), sum(op["iov"]))
        elif k == "read" and fd is not None and fd.read:
            fd.pos += max(0, min(op["length"], len(self.inodes[fd.ino].data) - fd.pos))
        elif k == "mmap_write" and fd is not None and fd.write:
            ino = self.inodes[fd.ino]
            end = min(op["offset"] + op["length"], len(ino.data))  # no page past EOF is written back
            if end > op["offset"]:
                self._write(ino, op["offset"], bytes([fill(i)]) * (end - op["offset"]))
        elif k == "copy_file_range":
            self._copy(self.fds.get(op["from_fd"]), fd, op["from_offset"], op["offset"], op["length"])
        elif k == "clone" and fd is not None:
            # Refused where the file system has no shared extents (EOPNOTSUPP) or for an
            # unaligned range (EINVAL): the file system's call, so no check of its bytes.
            self.inodes[fd.ino].exact = False
        elif k == "fallocate" and fd is not None and fd.write:
            self._fallocate(self.inodes[fd.ino], set(op["mode"]), op["offset"], op["length"])
        elif k == "ftruncate" and fd is not None and fd.write:
            self._resize(self.inodes[fd.ino], op["length"])
        elif k == "truncate":
            ino = self.inode_at(op["path"])
            if ino is not None and ino.kind == "file":
                self._resize(ino, op["length"])
        elif k == "rename":
            self._rename(op["from"], op["to"], op.get("flags", []))
        elif k == "link":
            src = self.names.get(op["from"])
            if src is not None and self.inodes[src].kind != "dir" and op["to"] not in self.names \
                    and self._parent_ok(op["to"]):
                self.names[op["to"]] = src
        elif k == "symlink":
            if op["path"] not in self.names and self._parent_ok(op["path"]):
                self._new(op["path"], "symlink", target=op["target"])
        elif k == "unlink":
            ino = self.inode_at(op["path"])
            if ino is not None and ino.kind != "dir":
                del self.names[op["path"]]
        elif k == "rmdir":
            ino = self.inode_at(op["path"])
            if ino is not None and ino.kind == "dir" and not self._children(op["path"]):
                del self.names[op["path"]]
        elif k == "mkdir":
            if op["path"] not in self.names and self._parent_ok(op["path"]):
                self._new(op["path"], "dir")
        elif k == "setxattr":
            ino = self.inode_at(op["path"])
            if ino is not None and ino.kind != "symlink":
                ino.xattrs[op["name"]] = bytes([fill(i)]) * op["length"]
        elif k == "removexattr":
            ino = self.inode_at(op["path"])
            if ino is not None:
                ino.xattrs.pop(op["name"], None)
        # fsync, fdatasync, syncfs, sync, sync_file_range, pread, statx: nothing to model

    def inode_at(self, path: str) -> Inode | None:
        ino = self.names.get(path)
        return None if ino is None else self.inodes[ino]

    def _fallocate(self, ino: Inode, mode: set[str], off: int, length: int) -> None:
        end = off + length
        if mode & {"COLLAPSE_RANGE", "INSERT_RANGE"}:
            ino.exact = False
        elif "PUNCH_HOLE" in mode:
            zero_end = min(end, len(ino.data))
            if zero_end > off:
                ino.data[off:zero_end] = bytes(zero_end - off)
        elif "ZERO_RANGE" in mode:
            zero_end = min(end, len(ino.data))
            if zero_end > off:
                ino.data[off:zero_end] = bytes(zero_end - off)
            if "KEEP_SIZE" not in mode and end > len(ino.data):
                self._resize(ino, end)
        elif "UNSHARE_RANGE" not in mode and "KEEP_SIZE" not in mode and end > len(ino.data):
            self._resize(ino, end)


def states_of(ops: list[dict[str, Any]]) -> list[State]:
    return Model().run(ops)
