"""A finding's ops in the two languages the exports speak.

- pc-repro arguments (the bundled C program of the shell export): the same
  syscalls in the same order with the same named fds held open, so the
  reproduction is the executor's run minus the pattern data (one byte value
  per op instead of the self-describing chunks).
- xfs_io and shell commands (the fstests export, in fstests' own idiom): the
  test's shell holds each fd the finding opened (`exec N<>path`) until the
  finding closed it, and each fd op is one xfs_io command on /proc/self/fd/N:
  the same file even after an unlink or rename (the generic/764 shape), with
  the fd's O_DIRECT/O_SYNC/O_APPEND flags, as one syscall (`-b LEN`). Data
  bytes are 'a' + op number % 26 (pc-repro's too). What xfs_io cannot say
  (unequal iovecs, RWF_SYNC) the test says in a comment. A shell cannot open
  O_TMPFILE: such an open and the ops on its fd that follow it (a linkat is
  xfs_io's flink) are one `xfs_io -T` process, as generic/509 makes its
  tmpfile; once linked, the shell holds the file by that name for later ops.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from harness.reports.export.model import Model, fill

O_FLAGS = {"O_CREAT": os.O_CREAT, "O_RDWR": os.O_RDWR, "O_WRONLY": os.O_WRONLY, "O_RDONLY": os.O_RDONLY,
           "O_TRUNC": os.O_TRUNC, "O_APPEND": os.O_APPEND, "O_DIRECT": os.O_DIRECT, "O_SYNC": os.O_SYNC,
           "O_DSYNC": os.O_DSYNC, "O_EXCL": os.O_EXCL, "O_TMPFILE": os.O_TMPFILE}
FALLOC = {"KEEP_SIZE": 0x01, "PUNCH_HOLE": 0x02, "COLLAPSE_RANGE": 0x08, "ZERO_RANGE": 0x10,
          "INSERT_RANGE": 0x20, "UNSHARE_RANGE": 0x40}
SFR = {"WAIT_BEFORE": 1, "WRITE": 2, "WAIT_AFTER": 4}
RENAME = {"NOREPLACE": 1, "EXCHANGE": 2}
XCHG = {"TO_EOF": 1, "DSYNC": 2, "FILE1_WRITTEN": 8}  # XFS_EXCHANGE_RANGE_* (fs/xfs/libxfs/xfs_fs.h)
XATTR = {"CREATE": 1, "REPLACE": 2}  # XATTR_* (include/uapi/linux/xattr.h)
RWF = {"RWF_HIPRI": 1, "RWF_DSYNC": 2, "RWF_SYNC": 4, "RWF_NOWAIT": 8, "RWF_APPEND": 16, "RWF_ATOMIC": 64}
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
        elif k == "pwritev2":
            out += [k, op["fd"], str(op.get("offset", -1)), str(_bits(op.get("flags", []), RWF)),
                    ",".join(str(n) for n in op["iov"])]
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
        elif k in ("copy_file_range", "clone"):
            out += [k, op["from_fd"], str(op.get("from_offset", 0)), op["fd"], str(op.get("offset", 0)),
                    str(op.get("length", 0))]
        elif k == "exchange_range":
            out += [k, op["from_fd"], str(op.get("from_offset", 0)), op["fd"], str(op.get("offset", 0)),
                    str(op.get("length", 0)), str(_bits(op.get("flags", []), XCHG))]
        elif k in ("unlink", "rmdir"):
            out += [k, op["path"]]
        elif k == "mkdir":
            out += [k, op["path"], str(_mode(op, "0755"))]
        elif k == "setxattr" and op.get("count", 1) > 1:
            out += ["setxattrs", op["path"], op["name"], str(op["length"]), str(op["count"])]
        elif k == "setxattr":
            out += [k, op["path"], op["name"], str(op["length"])]
        elif k == "fsetxattr":
            out += [k, op["fd"], op["name"], str(op["length"]), str(_bits(op.get("flags", []), XATTR))]
        elif k == "removexattr":
            out += [k, op["path"], op["name"]]
        elif k == "mmap_write":
            out += [k, op["fd"], str(op["offset"]), str(op["length"]), "1" if op.get("msync") else "0"]
        else:
            raise ValueError(f"no pc-repro form for op {k!r}")
    return out + ["mark", CRASH_MARK]


@dataclass
class XfsIoScript:
    """Shell lines for fstests: paths under $SCRATCH_MNT, every fd the finding opened
    held open by the test's shell (`exec N<>path`) and used through /proc/self/fd/N (inherited),
    so an fsync on an fd whose file was unlinked or renamed reaches that same file."""

    lines: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    needs: set[str] = field(default_factory=set)   # extra _require_* lines
    shell_fds: dict[str, int] = field(default_factory=dict)   # the finding's fd name -> the shell's fd number
    fd_flags: dict[str, list[str]] = field(default_factory=dict)  # its flags each reopen repeats
    unmade: set[str] = field(default_factory=set)   # names the ops give that these lines cannot (O_TMPFILE + linkat)
    model: Model = field(default_factory=lambda: Model([]))
    tmpfile: _Tmpfile | None = None   # the O_TMPFILE fd whose xfs_io -T run is being collected
    gone: set[str] = field(default_factory=set)   # O_TMPFILE fds closed unlinked when their xfs_io exited

    def emit(self, cmd: str) -> None:
        self.lines.append(f"{cmd} >> $seqres.full 2>&1")

    def xfs_io(self, name: str, *cmds: str) -> None:
        if self.tmpfile is not None and self.tmpfile.fd == name:
            self.tmpfile.cmds += [f"-c {shlex.quote(x)}" for x in cmds]
            return
        if name in self.gone:
            self.lines.append(f"# ({' '.join(cmds)} on fd {name}: its O_TMPFILE file had no name when its "
                              "xfs_io exited, so nothing can reopen it here)")
            return
        fd = self.model.fds.get(name)
        if fd is None or name not in self.shell_fds:
            self.lines.append(f"# ({' '.join(cmds)} on fd {name}, which is not open here: its open failed "
                              "in the finding's run too)")
            return
        flags = self.fd_flags[name]
        opts = ["-r"] if not fd.write else []
        opts += ["-d"] if "O_DIRECT" in flags else []
        opts += ["-s"] if {"O_SYNC", "O_DSYNC"} & set(flags) else []
        opts += ["-a"] if "O_APPEND" in flags else []
        if "O_DSYNC" in flags:
            self.caveats.append("xfs_io has no O_DSYNC open flag: the fd is reopened O_SYNC (stronger)")
        c = " ".join(f"-c {shlex.quote(x)}" for x in cmds)
        self.emit(" ".join(["$XFS_IO_PROG", *opts, c, f"/proc/self/fd/{self.shell_fds[name]}"]))

    def op(self, i: int, op: dict[str, Any]) -> None:
        k = op["op"]
        name = op.get("fd", "")
        if self.tmpfile is not None and (name != self.tmpfile.fd or k not in TMPFILE_OPS):
            self.finish_tmpfile(closing=k == "close" and name == self.tmpfile.fd)
        fd = self.model.fds.get(name)
        pat = f"-S 0x{fill(i):02x}"
        if k == "open" and "O_TMPFILE" in op["flags"]:
            self.tmpfile = _Tmpfile(name, op["path"], op["flags"])
            self.needs.add("_require_xfs_io_command -T")
        elif k == "linkat" and self.tmpfile is not None:
            # flink is linkat(fd, "", AT_FDCWD, to, AT_EMPTY_PATH) on xfs_io's own fd
            self.tmpfile.cmds.append(f'-c "flink $SCRATCH_MNT/{op["to"]}"')
            self.needs.add("_require_xfs_io_command flink")
            self.tmpfile.linked = op["to"]
        elif k in ("open", "creat"):
            self._open(op, k)
        elif k == "close":
            if name in self.shell_fds:
                self.lines.append(f"exec {self.shell_fds.pop(name)}<&-")
        elif k in ("write", "pwrite"):
            off = op.get("offset", fd.pos if fd else 0)
            self.xfs_io(name, f"pwrite {pat} -b {max(op['length'], 1)} {off} {op['length']}")
        elif k == "pwritev2":
            self._pwritev2(name, op, pat, fd.pos if fd else 0)
        elif k in ("read", "pread"):
            self.xfs_io(name, f"pread -b {max(op['length'], 1)} {op.get('offset', fd.pos if fd else 0)} {op['length']}")
        elif k == "fallocate":
            mode = set(op["mode"])
            cmd = {"PUNCH_HOLE": "fpunch", "ZERO_RANGE": "fzero", "COLLAPSE_RANGE": "fcollapse",
                   "INSERT_RANGE": "finsert", "UNSHARE_RANGE": "funshare"}
            verb = next((cmd[m] for m in op["mode"] if m in cmd), "falloc")
            keep = " -k" if "KEEP_SIZE" in mode and verb in ("falloc", "fzero") else ""
            self.xfs_io(name, f"{verb}{keep} {op['offset']} {op['length']}")
        elif k == "ftruncate":
            self.xfs_io(name, f"truncate {op['length']}")
        elif k == "truncate":
            self.emit(f"truncate -c -s {op['length']} {_mnt(op['path'])}")
        elif k in ("fsync", "fdatasync", "syncfs"):
            self.xfs_io(name, k)
        elif k == "sync":
            self.emit("sync")
        elif k == "sync_file_range":
            flag = {"WAIT_BEFORE": "-b", "WRITE": "-w", "WAIT_AFTER": "-a"}
            fl = " ".join(flag[f] for f in op["flags"])
            self.xfs_io(name, f"sync_range {fl} {op['offset']} {op['length']}")
        elif k == "rename":
            flags = op.get("flags", [])
            if flags:
                self.needs.add("_require_renameat2 " + ("noreplace" if "NOREPLACE" in flags else "exchange"))
                opt = "-n" if "NOREPLACE" in flags else "-x"
                self.emit(f"$here/src/renameat2 {opt} {_mnt(op['from'])} {_mnt(op['to'])}")
            else:
                self.emit(f"mv -T {_mnt(op['from'])} {_mnt(op['to'])}")
        elif k == "link":
            self.emit(f"ln {_mnt(op['from'])} {_mnt(op['to'])}")
        elif k == "linkat" and name in self.shell_fds:  # xfs_io's flink: linkat(fd, "", ..., AT_EMPTY_PATH)
            self.needs.add("_require_xfs_io_command flink")
            self.emit(f'$XFS_IO_PROG -c "flink $SCRATCH_MNT/{op["to"]}" /proc/self/fd/{self.shell_fds[name]}')
        elif k == "linkat":
            self.unmade.add(op["to"])
            self.lines.append(f"# linkat(fd {name}, {op['to']}): fd {name} is not open here (see the caveats)")
        elif k in ("copy_file_range", "clone"):
            self._copy(op)
        elif k == "exchange_range":
            self._exchange(op)
        elif k == "symlink":
            self.emit(f"ln -s {shlex.quote(op['target'])} {_mnt(op['path'])}")
        elif k == "unlink":
            self.emit(f"unlink {_mnt(op['path'])}")
        elif k == "rmdir":
            self.emit(f"rmdir {_mnt(op['path'])}")
        elif k == "mkdir":
            self.emit(f"mkdir -m {op.get('mode', '0755')} {_mnt(op['path'])}")
        elif k == "setxattr":
            self.needs.add("_require_attrs")
            value = f"\"$(head -c {op['length']} /dev/zero | tr '\\0' '{chr(fill(i))}')\""
            self.emit(f"$SETFATTR_PROG -n {op['name']} -v {value} {_mnt(op['path'])}")
            if op.get("count", 1) > 1:  # the names after the first: NAME.1 .. NAME.(COUNT-1),
                # stopping at the first failure as the executor does (ext4: ENOSPC)
                self.emit(f"for i in $(seq 1 {op['count'] - 1}); do $SETFATTR_PROG -n {op['name']}.$i "
                          f"-v {value} {_mnt(op['path'])} || break; done")
        elif k == "fsetxattr":
            self._fsetxattr(i, op)
        elif k == "removexattr":
            self.needs.add("_require_attrs")
            self.emit(f"$SETFATTR_PROG -x {op['name']} {_mnt(op['path'])}")
        elif k == "mmap_write":
            o, n = op["offset"], op["length"]
            start = o - o % 4096
            cmds = [f"mmap -w {start} {o + n - start}", f"mwrite {pat} {o} {n}"] + \
                ([f"msync -s {start} {o + n - start}"] if op.get("msync") else [])
            self.xfs_io(name, *cmds)
        else:
            raise ValueError(f"no xfs_io form for op {k!r}")
        self.model.apply(i, op)
        if k == "linkat" and self.tmpfile is not None and not self._names_fd(op["to"], name):
            self.tmpfile.linked = None     # the link failed in the finding's run (O_EXCL, a name taken)
        if self.tmpfile is not None and self.tmpfile.fd not in self.model.fds:
            self.lines.append(f"# open({self.tmpfile.path}, O_TMPFILE) as fd {name} fails here as in the "
                              "finding's run")
            self.tmpfile = None

    def _names_fd(self, path: str, name: str) -> bool:
        """Whether PATH is now a name of the file fd NAME holds (in the model)."""
        fd, at = self.model.fds.get(name), self.model.inode_at(path)
        held = self.model.b.fds.get((0, fd.slot)) if fd is not None else None
        return at is not None and held is not None and at.ino == held[0]

    def finish_tmpfile(self, closing: bool = False, last: bool = False) -> None:
        """The collected O_TMPFILE run as one xfs_io -T process; after it exits the shell holds
        the file by the name it was linked to when later ops use the fd, else the fd is gone
        (after the last op nothing is opened: an open would be one op more before the power cut)."""
        t, self.tmpfile = self.tmpfile, None
        if t is None:
            return
        opts = ["-T"] + ["-d"] * ("O_DIRECT" in t.flags) + ["-s"] * bool({"O_SYNC", "O_DSYNC"} & set(t.flags)) \
            + ["-a"] * ("O_APPEND" in t.flags)
        self.emit(" ".join(["$XFS_IO_PROG", *opts, *t.cmds, _mnt(t.path)]))
        if closing:     # the finding closes it where xfs_io exits
            return
        if last:
            self.caveats.append(f"fd {t.fd} (an O_TMPFILE file) closes when its xfs_io exits, before the power "
                                "cut (the finding still held it)")
            return
        if t.linked is None:
            self.gone.add(t.fd)
            self.caveats.append(f"fd {t.fd} (an O_TMPFILE file) closes when its xfs_io exits; it had no "
                                "name, so the ops on it after that are comments")
            return
        number = 3 + len(self.shell_fds)
        while number in self.shell_fds.values():
            number += 1
        self.lines.append(f"exec {number}<>{_mnt(t.linked)}")
        self.shell_fds[t.fd] = number
        self.fd_flags[t.fd] = [f for f in t.flags if f in ("O_DIRECT", "O_SYNC", "O_DSYNC", "O_APPEND")]
        self.caveats.append(f"fd {t.fd} (an O_TMPFILE file) is xfs_io's until it exits; the shell then holds "
                            f"the file by its linked name {t.linked}")

    def _open(self, op: dict[str, Any], k: str) -> None:
        """Bash's redirections are open(2) with fixed flags: the one that does what
        the finding's open did to the file is chosen; O_DIRECT and O_SYNC go on
        each xfs_io reopen instead."""
        flags = ["O_CREAT", "O_WRONLY", "O_TRUNC"] if k == "creat" else op["flags"]
        ino = self.model.inode_at(op["path"])
        write = "O_WRONLY" in flags or "O_RDWR" in flags
        name, path = op["fd"], _mnt(op["path"])
        if ino is None and "O_CREAT" not in flags or ino is not None and "O_CREAT" in flags and "O_EXCL" in flags:
            self.lines.append(f"# open({op['path']}) fails here as in the finding's run (the file "
                              f"{'does not exist' if ino is None else 'exists'})")
            return
        number = 3 + len(self.shell_fds)
        while number in self.shell_fds.values():
            number += 1
        if ino is None:
            redirect = f"<>{path}"           # O_RDWR|O_CREAT: the file is new, nothing to truncate
        elif "O_TRUNC" in flags and write and ino.kind == "file":
            redirect = f">{path}"            # O_WRONLY|O_CREAT|O_TRUNC
        elif write and ino.kind == "file":
            redirect = f"<>{path}"           # O_RDWR (also for O_WRONLY: bash has no write-only open
                                             # that neither truncates nor appends)
        else:
            redirect = f"<{path}"            # O_RDONLY: holds the file (or directory)
        self.lines.append(f"exec {number}{redirect}")
        self.shell_fds[name] = number
        self.fd_flags[name] = [f for f in flags if f in ("O_DIRECT", "O_SYNC", "O_DSYNC", "O_APPEND")]

    def _copy(self, op: dict[str, Any]) -> None:
        """xfs_io's copy_range and reflink, run on the destination fd with the source's
        fd as the file to read (/proc/self/fd/N: the same file the finding's fd held)."""
        src = self.shell_fds.get(op["from_fd"])
        if src is None:
            self.lines.append(f"# {op['op']} from fd {op['from_fd']}, which is not open here: its open failed "
                              "in the finding's run too")
            return
        s_off, d_off, n = op.get("from_offset", 0), op.get("offset", 0), op.get("length", 0)
        if op["op"] == "copy_file_range":
            self.needs.add("_require_xfs_io_command copy_range")
            self.xfs_io(op["fd"], f"copy_range -s {s_off} -d {d_off} -l {n} /proc/self/fd/{src}")
        else:
            self.needs.add("_require_scratch_reflink")
            rng = f" {s_off} {d_off} {n}" if s_off or d_off or n else ""  # none: FICLONE, the whole file
            self.xfs_io(op["fd"], f"reflink /proc/self/fd/{src}{rng}")

    def _exchange(self, op: dict[str, Any]) -> None:
        """xfs_io's exchangerange (xfsprogs 6.10+): run on file2's fd with file1 by path; it
        exchanges to EOF unless given -l, -f asks for DSYNC, -w for FILE1_WRITTEN."""
        src = self.shell_fds.get(op["from_fd"])
        if src is None:
            self.lines.append(f"# exchange_range with fd {op['from_fd']}, which is not open here: its open "
                              "failed in the finding's run too")
            return
        self.needs.add("_require_xfs_io_command exchangerange")
        flags = op.get("flags", [])
        opts = f"-s {op.get('from_offset', 0)} -d {op.get('offset', 0)}"
        opts += "" if "TO_EOF" in flags else f" -l {op.get('length', 0)}"
        opts += " -f" * ("DSYNC" in flags) + " -w" * ("FILE1_WRITTEN" in flags)
        self.xfs_io(op["fd"], f"exchangerange {opts} /proc/self/fd/{src}")

    def _fsetxattr(self, i: int, op: dict[str, Any]) -> None:
        """setfattr on the fd's /proc/self/fd/N (the same file); setfattr has no XATTR_CREATE
        or XATTR_REPLACE, so a getfattr of the name decides whether it runs, as the flag would."""
        name = op["fd"]
        if name not in self.shell_fds:
            self.lines.append(f"# fsetxattr({op['name']}) on fd {name}, which is not open here: its open failed "
                              "in the finding's run too")
            return
        self.needs.add("_require_attrs")
        path = f"/proc/self/fd/{self.shell_fds[name]}"
        value = f"\"$(head -c {op['length']} /dev/zero | tr '\\0' '{chr(fill(i))}')\""
        setf = f"$SETFATTR_PROG -n {op['name']} -v {value} {path}"
        flags = op.get("flags", [])
        if flags:
            self.caveats.append(f"fsetxattr with XATTR_{'|XATTR_'.join(flags)}: a getfattr of the name, then "
                                "setfattr (two calls where the finding made one)")
            test = f"$GETFATTR_PROG -n {op['name']} {path} >/dev/null 2>&1"
            # CREATE: only if absent; REPLACE: only if present; both: never
            setf = "false" if len(flags) == 2 else f"{test} || {setf}" if "CREATE" in flags else f"{test} && {setf}"
        self.emit(setf)

    def _pwritev2(self, name: str, op: dict[str, Any], pat: str, pos: int) -> None:
        iov, flags = op["iov"], set(op.get("flags", []))
        off = pos if op.get("offset", -1) < 0 else op["offset"]
        opts = [pat]
        if len(set(iov)) == 1:
            opts += [f"-V {len(iov)}", f"-b {iov[0]}"]
        else:
            opts += [f"-V 1 -b {sum(iov)}"]
            self.caveats.append(f"pwritev2 with iovecs {iov}: xfs_io writes equal iovecs only; "
                                "one iovec of their total here")
        for flag, opt in (("RWF_DSYNC", "-D"), ("RWF_NOWAIT", "-N"), ("RWF_ATOMIC", "-A")):
            if flag in flags:
                opts.append(opt)
                if opt == "-A":
                    self.needs.add("_require_xfs_io_command pwrite -A")
        for flag in sorted(flags - {"RWF_DSYNC", "RWF_NOWAIT", "RWF_ATOMIC"}):
            self.caveats.append(f"pwritev2 flag {flag} has no xfs_io form: written without it")
        self.xfs_io(name, f"pwrite {' '.join(opts)} {off} {sum(iov)}")


# ops on an O_TMPFILE fd that go into its xfs_io -T run (xfs_io commands on that fd)
TMPFILE_OPS = {"write", "pwrite", "pwritev2", "read", "pread", "fallocate", "ftruncate", "fsync", "fdatasync",
               "syncfs", "sync_file_range", "mmap_write", "linkat"}


@dataclass
class _Tmpfile:
    fd: str
    path: str                      # the directory it was made in
    flags: list[str]
    cmds: list[str] = field(default_factory=list)   # `-c CMD`, quoted
    linked: str | None = None      # the name a linkat gave it


def _mnt(path: str) -> str:
    return f"$SCRATCH_MNT/{shlex.quote(path)}"


def xfs_io_script(ops: list[dict[str, Any]]) -> XfsIoScript:
    s = XfsIoScript(model=Model(ops))
    for i, op in enumerate(ops):
        s.op(i, op)
    s.finish_tmpfile(last=True)
    return s


def describe(op: dict[str, Any]) -> str:
    """One op as a reader writes it: `ftruncate(bar, 3000)`."""
    k = op["op"]
    args = [str(op[a]) for a in ("path", "from", "to", "target", "name", "offset", "length", "count") if a in op]
    if k == "fallocate":
        args.insert(0, "|".join(op["mode"]) or "0")
    if "fd" in op and k not in ("open", "creat"):
        args.insert(0, f"fd {op['fd']}")
    if k == "open":
        args.append("|".join(op["flags"]))
    return f"{k}({', '.join(args)})"
