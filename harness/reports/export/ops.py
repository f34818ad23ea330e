"""A finding's ops in the two languages the exports speak.

- pc-repro arguments (the bundled C program of the shell export): the same
  syscalls in the same order with the same named fds held open, so the
  reproduction is the executor's run minus the pattern data (one byte value
  per op instead of the self-describing chunks).
- xfs_io and shell commands (the fstests export, in fstests' own idiom): every
  fd op reopens the file by the path it was opened with (and with its
  O_DIRECT/O_SYNC/O_DSYNC/O_APPEND flags), since separate commands cannot
  share an fd. Where that differs (an op on an fd whose file was renamed or
  unlinked since its open) the export says so in a comment.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Any

O_FLAGS = {"O_CREAT": os.O_CREAT, "O_RDWR": os.O_RDWR, "O_WRONLY": os.O_WRONLY, "O_RDONLY": os.O_RDONLY,
           "O_TRUNC": os.O_TRUNC, "O_APPEND": os.O_APPEND, "O_DIRECT": os.O_DIRECT, "O_SYNC": os.O_SYNC,
           "O_DSYNC": os.O_DSYNC, "O_EXCL": os.O_EXCL, "O_TMPFILE": os.O_TMPFILE}
FALLOC = {"KEEP_SIZE": 0x01, "PUNCH_HOLE": 0x02, "COLLAPSE_RANGE": 0x08, "ZERO_RANGE": 0x10,
          "INSERT_RANGE": 0x20, "UNSHARE_RANGE": 0x40}
SFR = {"WAIT_BEFORE": 1, "WRITE": 2, "WAIT_AFTER": 4}
RENAME = {"NOREPLACE": 1, "EXCHANGE": 2}
CRASH_MARK = "pc-crash"


def _mode(op: dict[str, Any], default: str) -> int:
    return int(str(op.get("mode", default)), 8)


def _bits(names: list[str], table: dict[str, int]) -> int:
    out = 0
    for n in names:
        out |= table[n]
    return out


def repro_args(ops: list[dict[str, Any]]) -> list[str]:
    """pc-repro `ops` arguments for OPS, then the crash mark."""
    out: list[str] = []
    for op in ops:
        k = op["op"]
        if k == "open":
            out += ["open", op["fd"], op["path"], str(_bits(op["flags"], O_FLAGS)), str(_mode(op, "0644"))]
        elif k == "creat":
            flags = os.O_CREAT | os.O_WRONLY | os.O_TRUNC
            out += ["open", op["fd"], op["path"], str(flags), str(_mode(op, "0644"))]
        elif k in ("close", "fsync", "fdatasync", "syncfs"):
            out += [k, op["fd"]]
        elif k in ("write", "read"):
            out += [k, op["fd"], str(op["length"])]
        elif k in ("pwrite", "pread"):
            out += [k, op["fd"], str(op["offset"]), str(op["length"])]
        elif k == "fallocate":
            out += [k, op["fd"], str(_bits(op["mode"], FALLOC)), str(op["offset"]), str(op["length"])]
        elif k == "ftruncate":
            out += [k, op["fd"], str(op["length"])]
        elif k == "truncate":
            out += [k, op["path"], str(op["length"])]
        elif k == "sync":
            out += ["sync"]
        elif k == "sync_file_range":
            out += [k, op["fd"], str(op["offset"]), str(op["length"]), str(_bits(op["flags"], SFR))]
        elif k == "rename":
            out += [k, op["from"], op["to"], str(_bits(op.get("flags", []), RENAME))]
        elif k == "link":
            out += [k, op["from"], op["to"]]
        elif k == "linkat":
            out += [k, op["fd"], op["to"]]
        elif k == "symlink":
            out += [k, op["target"], op["path"]]
        elif k in ("unlink", "rmdir"):
            out += [k, op["path"]]
        elif k == "mkdir":
            out += [k, op["path"], str(_mode(op, "0755"))]
        elif k == "setxattr":
            out += [k, op["path"], op["name"], str(op["length"])]
        elif k == "removexattr":
            out += [k, op["path"], op["name"]]
        elif k == "mmap_write":
            out += [k, op["fd"], str(op["offset"]), str(op["length"]), "1" if op.get("msync") else "0"]
        else:
            raise ValueError(f"no pc-repro form for op {k!r}")
    return out + ["mark", CRASH_MARK]


@dataclass
class _Fd:
    path: str
    flags: list[str]
    pos: int = 0
    moved: bool = False      # renamed or unlinked since it was opened


@dataclass
class XfsIoScript:
    """Shell lines for fstests, run from nowhere in particular: paths under $SCRATCH_MNT."""

    lines: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    fds: dict[str, _Fd] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    needs: set[str] = field(default_factory=set)   # extra _require_* lines

    def emit(self, cmd: str) -> None:
        self.lines.append(f"{cmd} >> $seqres.full 2>&1")

    def xfs_io(self, fd: _Fd, *cmds: str, create: bool = False, trunc: bool = False) -> None:
        opts = ["-f"] if create else []
        opts += ["-t"] if trunc else []
        opts += ["-d"] if "O_DIRECT" in fd.flags else []
        opts += ["-s"] if {"O_SYNC", "O_DSYNC"} & set(fd.flags) else []
        opts += ["-a"] if "O_APPEND" in fd.flags else []
        if fd.moved:
            self.caveats.append(f"an op on an fd of {fd.path} after it was renamed or unlinked: "
                                "reopened by its old path here, not the same file as in the finding")
        c = " ".join(f"-c {shlex.quote(x)}" for x in cmds)
        self.emit(f"$XFS_IO_PROG {' '.join(opts)} {c} {_mnt(fd.path)}".replace("  ", " "))

    def op(self, op: dict[str, Any]) -> None:
        k = op["op"]
        fd = self.fds.get(op.get("fd", ""))
        fill = "-S 0x61"
        if k == "open" and "O_TMPFILE" in op["flags"]:
            # xfs_io -T opens a tmpfile, but separate commands cannot share it, and this
            # export runs one command per op: the tmpfile's ops are left out, with a caveat.
            self.fds[op["fd"]] = _Fd(op["path"], ["O_TMPFILE"])
            self.caveats.append(f"an O_TMPFILE file in {op['path']}: its ops are left out here; "
                                "use the shell export (pc-repro) to replay it")
            self.lines.append(f"# open O_TMPFILE in {op['path']} as fd {op['fd']}: left out (see the caveat)")
        elif k in ("open", "creat"):
            flags = ["O_CREAT", "O_WRONLY", "O_TRUNC"] if k == "creat" else op["flags"]
            new = _Fd(op["path"], [f for f in flags if f in ("O_DIRECT", "O_SYNC", "O_DSYNC", "O_APPEND")])
            self.fds[op["fd"]] = new
            if "O_CREAT" in flags or "O_TRUNC" in flags:
                self.xfs_io(new, "close", create="O_CREAT" in flags, trunc="O_TRUNC" in flags)
                if "O_TRUNC" in flags:
                    self.sizes[op["path"]] = 0
        elif k == "close":
            self.fds.pop(op["fd"], None)
        elif fd is not None and "O_TMPFILE" in fd.flags:
            self.lines.append(f"# {k} on the O_TMPFILE fd {op['fd']}: left out (see the caveat)")
        elif fd is not None and k in ("write", "pwrite"):
            off = op.get("offset", self.sizes.get(fd.path, 0) if "O_APPEND" in fd.flags else fd.pos)
            self.xfs_io(fd, f"pwrite {fill} {off} {op['length']}")
            if k == "write":
                fd.pos = off + op["length"]
            self.sizes[fd.path] = max(self.sizes.get(fd.path, 0), off + op["length"])
        elif fd is not None and k in ("read", "pread"):
            self.xfs_io(fd, f"pread {op.get('offset', fd.pos)} {op['length']}")
        elif fd is not None and k == "fallocate":
            mode = set(op["mode"])
            cmd = {"PUNCH_HOLE": "fpunch", "ZERO_RANGE": "fzero", "COLLAPSE_RANGE": "fcollapse",
                   "INSERT_RANGE": "finsert", "UNSHARE_RANGE": "funshare"}
            name = next((cmd[m] for m in op["mode"] if m in cmd), "falloc")
            keep = " -k" if "KEEP_SIZE" in mode and name in ("falloc", "fzero") else ""
            self.xfs_io(fd, f"{name}{keep} {op['offset']} {op['length']}")
        elif fd is not None and k == "ftruncate":
            self.xfs_io(fd, f"truncate {op['length']}")
            self.sizes[fd.path] = op["length"]
        elif k == "truncate":
            self.emit(f"$XFS_IO_PROG -c {shlex.quote('truncate ' + str(op['length']))} {_mnt(op['path'])}")
        elif fd is not None and k in ("fsync", "fdatasync", "syncfs"):
            self.xfs_io(fd, k)
        elif k == "sync":
            self.emit("sync")
        elif fd is not None and k == "sync_file_range":
            flag = {"WAIT_BEFORE": "-b", "WRITE": "-w", "WAIT_AFTER": "-a"}
            fl = " ".join(flag[f] for f in op["flags"])
            self.xfs_io(fd, f"sync_range {fl} {op['offset']} {op['length']}")
        elif k == "rename":
            self._moved(op["from"])
            flags = op.get("flags", [])
            if flags:
                self.needs.add("_require_renameat2 " + ("noreplace" if "NOREPLACE" in flags else "exchange"))
                opt = "-n" if "NOREPLACE" in flags else "-x"
                self.emit(f"$here/src/renameat2 {opt} {_mnt(op['from'])} {_mnt(op['to'])}")
            else:
                self.emit(f"mv -T {_mnt(op['from'])} {_mnt(op['to'])}")
        elif k == "link":
            self.emit(f"ln {_mnt(op['from'])} {_mnt(op['to'])}")
        elif fd is not None and k == "linkat":  # xfs_io's flink: linkat(fd, "", ..., AT_EMPTY_PATH)
            if fd.moved:
                self.caveats.append(f"linkat of an fd of {fd.path} after it was renamed or unlinked: "
                                    "reopened by its old path here, not the same file as in the finding")
            self.emit(f'$XFS_IO_PROG -c "flink $SCRATCH_MNT/{op["to"]}" {_mnt(fd.path)}')
        elif k == "symlink":
            self.emit(f"ln -s {shlex.quote(op['target'])} {_mnt(op['path'])}")
        elif k == "unlink":
            self._moved(op["path"])
            self.emit(f"unlink {_mnt(op['path'])}")
        elif k == "rmdir":
            self.emit(f"rmdir {_mnt(op['path'])}")
        elif k == "mkdir":
            self.emit(f"mkdir -m {op.get('mode', '0755')} {_mnt(op['path'])}")
        elif k == "setxattr":
            self.needs.add("_require_attrs")
            self.emit(f"$SETFATTR_PROG -n {op['name']} -v 0x{'61' * op['length']} {_mnt(op['path'])}")
        elif k == "removexattr":
            self.needs.add("_require_attrs")
            self.emit(f"$SETFATTR_PROG -x {op['name']} {_mnt(op['path'])}")
        elif fd is not None and k == "mmap_write":
            o, n = op["offset"], op["length"]
            cmds = [f"mmap -w {o} {n}", f"mwrite {fill} {o} {n}"] + ([f"msync -s {o} {n}"] if op.get("msync") else [])
            self.xfs_io(fd, *cmds)
        elif fd is None and "fd" in op:
            self.lines.append(f"# {k} on fd {op['fd']}, which is not open here: skipped (the finding's run skipped it too)")
        else:
            raise ValueError(f"no xfs_io form for op {k!r}")

    def _moved(self, path: str) -> None:
        for fd in self.fds.values():
            if fd.path == path:
                fd.moved = True


def _mnt(path: str) -> str:
    return f"$SCRATCH_MNT/{shlex.quote(path)}"


def xfs_io_script(ops: list[dict[str, Any]]) -> XfsIoScript:
    s = XfsIoScript()
    for op in ops:
        s.op(op)
    return s


def describe(op: dict[str, Any]) -> str:
    """One op as a reader writes it: `ftruncate(bar, 3000)`."""
    k = op["op"]
    args = [str(op[a]) for a in ("path", "from", "to", "target", "name", "offset", "length") if a in op]
    if k == "fallocate":
        args.insert(0, "|".join(op["mode"]) or "0")
    if "fd" in op and k not in ("open", "creat"):
        args.insert(0, f"fd {op['fd']}")
    if k == "open":
        args.append("|".join(op["flags"]))
    return f"{k}({', '.join(args)})"
