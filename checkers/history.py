"""What the workload did, as a model: executed ops in completion order, applied
to a namespace and to per-inode content timelines.

Inputs are the plan, the executor's records (what each op returned) and the
positions of the executor's completion marks in the log. Ops are ordered by
their mark, i.e. by when they were known to have completed, so the ops
completed at a crash point are always a prefix (`position < n_done`). Marks
do not order ops of different threads that ran at the same time: their
other orders are "maybe" events too (checkers/overlap.py). Each
op is applied with its *actual* result: a failed op changes nothing, a short
write writes what it returned. One exception: a failed write may still have
written part of its range ("maybe" events, see op_write). While applying, the model predicts the
outcome of each op it is sure about; a disagreement with what the kernel
returned is a `semantics` finding (a bug without any crash).
"""

from __future__ import annotations

import bisect
import errno as E
import itertools
import os
from dataclasses import dataclass, field

from checkers.f2fs_batches import Batch, F2fsBatches
from checkers.overlap import other_orders
from checkers.timeline import DataEvent, Exec, Inode
from foundation.intervals import Piece, Src
from workloads.marks import parse_mark
from workloads.plan import Plan, xattr_names
from workloads.results import FLAG_SIGBUS, Results, StatxResult

PERSIST_INODE = {"fsync": "fsync-data", "fdatasync": "fdatasync-data"}
ROOT, ROOT_INO = ".", 0
O_SYNC_FLAGS = {"O_SYNC", "O_DSYNC"}
RWF_SYNC_FLAGS = {"RWF_SYNC", "RWF_DSYNC"}


@dataclass
class Persist:
    """A completed op that made something durable."""

    ex: Exec
    rule: str
    ino: int | None       # None: the whole file system (sync, syncfs)
    prefix: int           # ops at positions < prefix are covered
    range: tuple[int, int] | None = None  # O_SYNC writes and msync cover only the bytes they wrote
    names_only: bool = False  # names (not data or sizes): a btrfs commit writes no dirty pages


@dataclass
class Disagreement:
    ex: Exec
    expected: str


@dataclass
class History:
    plan: Plan
    execs: list[Exec]
    inodes: dict[int, Inode]
    ns: list[dict[str, int]]          # ns[i]: namespace after execs[:i] (shared when unchanged)
    persists: list[Persist]
    name_changes: list[tuple[int, frozenset[str], frozenset[int]]]  # (pos, paths, inodes touched)
    uncertain: set[str]               # paths the model could not follow (skip their checks)
    lost: bool                        # the model lost track somewhere: no content checks at all
    disagreements: list[Disagreement]
    threads: dict[int, list[int]]     # thread -> positions in its program order
    # btrfs: per fsync (its position), the first position of the transaction it logged in
    # (ops after the last commit the log shows before the call); checkers/btrfs_commits.py
    btrfs_since: dict[int, int] = field(default_factory=dict)

    def ns_at(self, pos: int) -> dict[str, int]:
        return self.ns[pos]


def completion_marks(marks: list[tuple[int, str]]) -> dict[tuple[int, int, int], int]:
    """(thread, seq, iter) -> log index of its completion mark."""
    out: dict[tuple[int, int, int], int] = {}
    for index, text in marks:
        m = parse_mark(text)
        if m is not None and m.event == "op":
            out.setdefault((m.thread, m.seq, m.iter), index)  # type: ignore[arg-type]
    return out


def _parent(path: str) -> str:
    return os.path.dirname(path)


def split_dot(raw: str) -> tuple[str, bool]:
    """RAW without its "." components (the root is "."), and whether its last one was "."."""
    parts = raw.split("/")
    return "/".join(p for p in parts if p not in (".", "")) or ROOT, parts[-1] == "."


class HistoryBuilder(F2fsBatches):
    """Applies executed ops one by one (apply) to the namespace and the inodes. The oracle
    builds its History with it; the exports drive it with predicted results
    (harness/reports/export/model.py), so both judge by the same semantics."""

    def __init__(self, plan: Plan, execs: list[Exec], reflink: bool | None = None,
                 exchange: bool | None = None) -> None:
        self.plan = plan
        self.execs = execs
        self._ended_by: list[int] | None = None  # prefix maxima of the execs' end times (prefix_before)
        # The mount's root directory exists from the start, named "." (a workload may
        # open it, e.g. to fsync it); every other path is relative to it.
        self.inodes: dict[int, Inode] = {ROOT_INO: Inode(ROOT_INO, "dir", -1)}
        self.ns: dict[str, int] = {ROOT: ROOT_INO}
        self.ns_list: list[dict[str, int]] = [self.ns]
        self.fds: dict[tuple[int, int], tuple[int, bool, bool]] = {}   # (thread, slot) -> (ino, o_sync, o_append)
        self.persists: list[Persist] = []
        self.name_changes: list[tuple[int, frozenset[str], frozenset[int]]] = []
        self.uncertain: set[str] = set()
        self.lost = False  # an op went where the model cannot follow: no content checks
        self.disagreements: list[Disagreement] = []
        self.statx: dict[int, StatxResult] = {}  # inode -> the untorn-write limits statx last read for it
        self.linkable: set[int] = set()   # O_TMPFILE files linkat may still name
        self.access: dict[tuple[int, int], tuple[bool, bool, bool]] = {}  # fd -> readable, writable, O_DIRECT
        self.reflink = reflink            # clones work here (None: not known, either answer is taken)
        self.exchange = exchange          # exchange_range works here (None: not known, as reflink)
        self._next_ino = 1
        self.batches: dict[int, Batch] = {}  # inode -> its open f2fs atomic batch (checkers/f2fs_batches.py)

    # -- helpers ---------------------------------------------------------
    def new_inode(self, kind: str, pos: int, target: str = "") -> Inode:
        ino = Inode(self._next_ino, kind, pos, target)
        self.inodes[ino.ino] = ino
        self._next_ino += 1
        return ino

    def lookup(self, path: str) -> Inode | None:
        i = self.ns.get(path)
        return self.inodes[i] if i is not None else None

    def resolve(self, path: str, follow: bool = True, depth: int = 0) -> str | None:
        """PATH with symlinks resolved as the kernel would (the last component
        only if FOLLOW); None where the model cannot tell (absolute or
        escaping targets, loops)."""
        cur = ""
        parts = path.split("/")
        for i, part in enumerate(parts):
            nxt = f"{cur}/{part}" if cur else part
            ino = self.lookup(nxt)
            if ino is not None and ino.kind == "symlink" and (follow or i < len(parts) - 1):
                target = os.path.normpath(os.path.join(os.path.dirname(nxt), ino.target))
                if depth > 8 or ino.target.startswith("/") or target.startswith("..") or target == ".":
                    return None
                resolved = self.resolve(target, True, depth + 1)
                if resolved is None:
                    return None
                nxt = resolved
            cur = nxt
        return cur

    def path(self, ex: Exec, name: str, follow: bool = True) -> str | None:
        """The op's path field, resolved; None (and the op's paths marked
        uncertain) when the model cannot follow it. "." components name the
        directory they are in ("./foo", "A/./foo" are foo, A/foo); a last "."
        ("A/.", ".") is the directory A itself, reached by the walk (a symlink
        there is followed), and the op decides what that means (`dotted`)."""
        raw = ex.f(name)
        norm, dot = split_dot(raw)
        got = self.resolve(norm, follow or dot)
        if got is None or self.under_uncertain(raw) or self.under_uncertain(got):
            self.uncertain.add(raw)
            if got is not None:
                self.uncertain.add(got)
            self.lost |= ex.ok and got is None
            return None
        return got

    @staticmethod
    def dotted(ex: Exec, name: str) -> bool:
        """The op's path field NAME ends in "." (fs/namei.c: its last component is LAST_DOT)."""
        return split_dot(ex.f(name))[1]

    def dir_errno(self, path: str) -> int | None:
        """errno of walking to PATH as a directory (the parent of a last "."): ENOENT or
        ENOTDIR where it is missing, ENOTDIR where it is no directory."""
        ino = self.lookup(path)
        if ino is None:
            return self.missing(path)
        return None if ino.kind == "dir" else E.ENOTDIR

    def under_uncertain(self, path: str) -> bool:
        """PATH or one of its ancestors is a path the model lost: e.g. a link made
        to a file it could not follow is not in its namespace, so names under
        that link resolve differently in the kernel (ENOTDIR, not ENOENT)."""
        parts = path.split("/")
        return any("/".join(parts[:k]) in self.uncertain for k in range(1, len(parts) + 1))

    def parent_ok(self, path: str) -> bool:
        p = _parent(path)
        return p == "" or (p in self.ns and self.inodes[self.ns[p]].kind == "dir")

    def missing(self, path: str) -> int:
        """errno of a lookup that finds nothing at PATH (resolved): ENOTDIR when an
        ancestor is not a directory (e.g. renamed over by a file), else ENOENT."""
        parts = path.split("/")
        for k in range(1, len(parts)):
            ancestor = self.lookup("/".join(parts[:k]))
            if ancestor is None:
                return E.ENOENT
            if ancestor.kind != "dir":
                return E.ENOTDIR
        return E.ENOENT

    def parent_errno(self, path: str) -> int | None:
        """errno of looking up PATH's parent directory, None if it is one."""
        parent = _parent(path)
        return None if parent == "" else self.dir_errno(parent)

    def children(self, path: str) -> list[str]:
        pre = path + "/"
        return [p for p in self.ns if p.startswith(pre)]

    def change_names(self, pos: int, updates: dict[str, int | None]) -> None:
        """Apply name updates (None: remove) as a new namespace version."""
        self.ns = dict(self.ns)
        touched = set()
        for p, i in updates.items():
            if p in self.ns:
                touched.add(self.ns[p])
            if i is None:
                self.ns.pop(p, None)
            else:
                self.ns[p] = i
                touched.add(i)
        self.name_changes.append((pos, frozenset(updates), frozenset(touched)))

    def data(self, ex: Exec, ino: Inode, start: int, end: int, src: Src | None, untorn: bool = False,
             batch: int | None = None) -> None:
        ino.content.set(start, end, src)
        if src is not None:
            ino.size = max(ino.size, end)
        ino.events.append(DataEvent(ex.pos, "data" if src else "zero", start, end, src, ino.size, untorn, batch=batch))

    def resize(self, ex: Exec, ino: Inode, size: int) -> None:
        if size < ino.size:
            ino.content.truncate(size)
            ino.events.append(DataEvent(ex.pos, "zero", size, ino.size, None, size))
        else:  # growing exposes zeros only: a size change, no content event
            ino.events.append(DataEvent(ex.pos, "size", size, size, None, size))
        ino.size = size

    def predict(self, ex: Exec, expected: int | None | tuple[int, ...]) -> None:
        """Record a semantics disagreement if the kernel's answer differs. EXPECTED is
        an errno, None for success, or the errnos the kernel may pick from (a man page
        that allows either, as rename(2) does for a nonempty target directory)."""
        actual = 0 if ex.ok else ex.rec.errno
        wants = expected if isinstance(expected, tuple) else (expected or 0,)
        if actual not in wants:
            exp = " or ".join("success" if not w else E.errorcode.get(w, str(w)) for w in wants)
            got = "success" if not actual else E.errorcode.get(actual, str(actual))
            self.disagreements.append(Disagreement(ex, f"expected {exp}, the kernel returned {got}"))

    # -- ops ---------------------------------------------------------------
    def apply(self, ex: Exec) -> None:
        handler = getattr(self, "op_" + ex.kind, None)
        if handler is not None:
            handler(ex)
        self.ns_list.append(self.ns)

    def fd_inode(self, ex: Exec) -> tuple[Inode | None, bool, bool]:
        got = self.fds.get((ex.rec.thread, ex.f("fd")))
        return (self.inodes[got[0]], got[1], got[2]) if got else (None, False, False)

    def two_paths(self, ex: Exec) -> tuple[str | None, str | None]:
        """from/to of rename and link (not followed); both uncertain if either is."""
        src, dst = self.path(ex, "from", follow=False), self.path(ex, "to", follow=False)
        if src is None or dst is None:
            self.uncertain |= {ex.f("from"), ex.f("to")} | {p for p in (src, dst) if p}
            return None, None
        return src, dst

    def op_open(self, ex: Exec) -> None:
        flags = set(ex.f("flags") or ())
        if ex.kind == "creat":
            flags |= {"O_CREAT", "O_WRONLY", "O_TRUNC"}
        # open(2): with O_CREAT | O_EXCL a symbolic link is not followed, so
        # any symlink there (dangling too) is EEXIST.
        path = self.path(ex, "path", follow=not {"O_CREAT", "O_EXCL"} <= flags)
        if path is None:
            return
        ino = self.lookup(path)
        if "O_TMPFILE" in flags:
            self.open_tmpfile(ex, ino, path, flags)
            return
        if self.dotted(ex, "path") and self.dir_errno(path):  # "foo/.", "missing/.": the walk fails
            self.predict(ex, self.dir_errno(path))
            return
        if ino is None and "O_CREAT" not in flags:
            self.predict(ex, self.missing(path))
        elif ino is None and not self.parent_ok(path):
            self.predict(ex, self.missing(path))
        elif ino is not None and {"O_CREAT", "O_EXCL"} <= flags:
            self.predict(ex, E.EEXIST)
        elif ino is not None and ino.kind == "dir" and flags & {"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC"}:
            # fs/namei.c do_open: O_CREAT on an existing directory is EISDIR whatever the
            # access mode; may_open: write access (O_TRUNC asks for it too) is EISDIR.
            self.predict(ex, E.EISDIR)
        elif ino is None or ino.kind == "file" or ino.kind == "dir" and flags <= {"O_RDONLY"}:
            self.predict(ex, None)  # a file, a new file, a directory opened plainly read-only
        if not ex.ok:
            return
        if ino is None:
            ino = self.new_inode("file", ex.pos)
            self.change_names(ex.pos, {path: ino.ino})
        elif "O_TRUNC" in flags and ino.kind == "file":
            self.resize(ex, ino, 0)
        self.bind_fd(ex, ino, flags)

    op_creat = op_open

    def bind_fd(self, ex: Exec, ino: Inode, flags: set[str]) -> None:
        key = (ex.rec.thread, ex.f("fd"))
        self.fds[key] = (ino.ino, bool(flags & O_SYNC_FLAGS), "O_APPEND" in flags)
        self.access[key] = ("O_WRONLY" not in flags, bool(flags & {"O_WRONLY", "O_RDWR"}), "O_DIRECT" in flags)

    def open_tmpfile(self, ex: Exec, d: Inode | None, path: str, flags: set[str]) -> None:
        """open(2) O_TMPFILE: opened for writing and without O_CREAT, else EINVAL before any
        lookup (fs/open.c build_open_flags); PATH must be a directory (ENOENT/ENOTDIR);
        the new file has no name, and linkat may give it one (it is linkable:
        fs/namei.c vfs_tmpfile sets I_LINKABLE unless O_EXCL)."""
        if "O_CREAT" in flags or not flags & {"O_WRONLY", "O_RDWR"}:
            self.predict(ex, E.EINVAL)
        elif d is None:
            self.predict(ex, self.missing(path))
        elif d.kind != "dir":
            self.predict(ex, E.ENOTDIR)
        else:
            self.predict(ex, None)
        if ex.ok:
            ino = self.new_inode("file", ex.pos)
            if "O_EXCL" not in flags:
                self.linkable.add(ino.ino)
            self.bind_fd(ex, ino, flags)

    def op_linkat(self, ex: Exec) -> None:
        """linkat(fd, "", AT_FDCWD, to, AT_EMPTY_PATH), in fs/namei.c's order: the new name's
        parent (ENOENT/ENOTDIR), the name taken (EEXIST), then vfs_link: a directory EPERM,
        a file with no name left that is not a linkable O_TMPFILE file ENOENT."""
        ino, _, _ = self.fd_inode(ex)
        dst = self.path(ex, "to", follow=False)
        if ino is None or dst is None:
            return
        self.predict(ex, self.new_link_errno(ino, dst, self.dotted(ex, "to")))
        if ex.ok:
            self.linkable.discard(ino.ino)  # vfs_link clears I_LINKABLE
            self.change_names(ex.pos, {dst: ino.ino})

    def op_copy_file_range(self, ex: Exec) -> None:
        """copy_file_range(2): the source range, cut at the source's end, lands in the
        destination (ret bytes: a short copy is legal, the model follows what was copied).
        Errors in fs/read_write.c's order (generic_copy_file_checks, then
        generic_file_rw_checks): a directory EISDIR, an fd not open for reading
        (source) or writing (destination, or O_APPEND) EBADF, then overlapping ranges
        of one file EINVAL."""
        src, dst = self.two_fds(ex)
        if src is None or dst is None:
            return
        s_in, s_out = ex.f("from_offset"), ex.f("offset")
        count = max(0, min(ex.f("length"), src.size - s_in))
        overlap = src is dst and s_out + count > s_in and s_out < s_in + count
        err = self.rw_errno(ex, src, dst) or (E.EINVAL if overlap else None)
        direct = any(self.access[(ex.rec.thread, ex.f(k))][2] for k in ("from_fd", "fd"))
        # Without a remap, vfs_copy_file_range falls back to do_splice_direct, which reads
        # and writes through the fds' own read_iter/write_iter: an O_DIRECT side keeps
        # O_DIRECT's alignment rule (open(2): EINVAL for an unaligned offset or length),
        # whose unit is the device's or the file system's; either answer is the kernel's.
        self.predict(ex, err if err or not direct else (0, E.EINVAL))
        if ex.ok and ex.rec.ret > 0 and dst.kind == "file":
            self.copy_range(ex, src, s_in, dst, s_out, ex.rec.ret)

    def op_clone(self, ex: Exec) -> None:
        """A reflink clone (ioctl_ficlone(2); fs/remap_range.c): after the checks
        copy_file_range makes too (EISDIR, EBADF), a file system without shared extents
        refuses it (EOPNOTSUPP: ext4, xfs -m reflink=0); then the range
        (generic_remap_checks, generic_remap_check_len): unaligned offsets EINVAL, a
        source offset at or past its end EINVAL, a length that would have to be shortened
        (past the source's end, or not block-aligned short of it) EINVAL, overlapping
        ranges of one file EINVAL, a partial last block into the middle of the
        destination EINVAL. Length 0 clones to the source's end (an offset right at it:
        nothing, success)."""
        src, dst = self.two_fds(ex)
        if src is None or dst is None:
            return
        pos_in, pos_out, length = ex.f("from_offset"), ex.f("offset"), ex.f("length")
        err, count = clone_range(src.size, dst.size, pos_in, pos_out, length, src is dst)
        rw = self.rw_errno(ex, src, dst)
        if rw or self.reflink is False:
            self.predict(ex, rw or E.EOPNOTSUPP)
        else:
            self.predict(ex, err if self.reflink else (err or 0, E.EOPNOTSUPP))
        if ex.ok and count > 0:
            self.copy_range(ex, src, pos_in, dst, pos_out, count)

    def op_exchange_range(self, ex: Exec) -> None:
        """XFS_IOC_EXCHANGE_RANGE (ioctl_xfs_exchange_range(2); fs/xfs/xfs_exchrange.c): file1
        (from_fd) and file2 (fd) must be regular files (EISDIR) open read-write and not
        O_APPEND (EBADF); a file system without the exchange-range feature refuses it
        (xfs: EOPNOTSUPP; ext4 and btrfs have no such ioctl: ENOTTY); then the ranges
        (exchange_range_check). The two ranges' contents change places; with TO_EOF
        each file ends where the other's bytes from its offset end. DSYNC, or an O_SYNC or
        O_DSYNC fd on either file: durable when it returns (the rule exchange-range-dsync);
        otherwise an fsync of each file makes its side durable, as for any write."""
        f1, f2 = self.two_fds(ex)
        if f1 is None or f2 is None:
            return
        flags = set(ex.f("flags"))
        off1, off2 = ex.f("from_offset"), ex.f("offset")
        err = self.exchange_fd_errno(ex, f1, f2)
        refused = (E.EOPNOTSUPP, E.ENOTTY)  # xfs without the feature; a file system without the ioctl
        n1, n2 = 0, 0
        if err is None and self.exchange is not False:
            err, n1, n2 = exchange_range_check(f1.size, f2.size, off1, off2, ex.f("length"),
                                               "TO_EOF" in flags, f1 is f2)
        if self.exchange:
            self.predict(ex, err)
        elif self.exchange is False:  # ext4's and btrfs's ioctl tables know no such number
            self.predict(ex, (err, E.ENOTTY) if err else refused)
        else:
            self.predict(ex, (err or 0, *refused))
        if not ex.ok or (n1 == 0 and n2 == 0):
            return
        if "FILE1_WRITTEN" in flags:
            # Only the blocks written in file1 change places (ioctl_xfs_exchange_range(2)):
            # which those are depends on allocation the model does not follow.
            self.lost = True
            return
        one, two = f1.content.get(off1, off1 + n1), f2.content.get(off2, off2 + n2)
        if "TO_EOF" in flags:
            self.resize(ex, f1, min(f1.size, off1 + n2))
            self.resize(ex, f2, min(f2.size, off2 + n1))
        self.place(ex, two, off2, f1, off1, n2)
        self.place(ex, one, off1, f2, off2, n1)
        if "TO_EOF" in flags:  # the sizes, whatever the ranges' tails hold (holes)
            self.resize(ex, f1, off1 + n2)
            self.resize(ex, f2, off2 + n1)
        # An O_SYNC/O_DSYNC fd on either file is the same as DSYNC (the man page; the kernel's
        # xfs_exchange_range_prep tests both files' f_flags against O_SYNC's bits).
        osync = any(self.fds[(ex.rec.thread, ex.f(k))][1] for k in ("from_fd", "fd"))
        if "DSYNC" in flags or osync:
            for ino, at, n in ((f1, off1, n2), (f2, off2, n1)):
                self.persists.append(Persist(ex, "exchange-range-dsync", ino.ino, ex.pos + 1, (at, at + n)))

    def exchange_fd_errno(self, ex: Exec, f1: Inode, f2: Inode) -> int | None:
        """fs/xfs/xfs_exchrange.c xfs_exchange_range: directories EISDIR, other non-files
        EINVAL, then both fds read-write (EBADF) and neither O_APPEND (EBADF)."""
        if f1.kind == "dir" or f2.kind == "dir":
            return E.EISDIR
        if f1.kind != "file" or f2.kind != "file":
            return E.EINVAL
        keys = [(ex.rec.thread, ex.f(k)) for k in ("from_fd", "fd")]
        if not all(self.access[k][0] and self.access[k][1] and not self.fds[k][2] for k in keys):
            return E.EBADF
        return None

    def two_fds(self, ex: Exec) -> tuple[Inode | None, Inode | None]:
        got = self.fds.get((ex.rec.thread, ex.f("from_fd")))
        src = self.inodes[got[0]] if got else None
        dst, _, _ = self.fd_inode(ex)
        return src, dst

    def rw_errno(self, ex: Exec, src: Inode, dst: Inode) -> int | None:
        """fs/read_write.c generic_file_rw_checks: directories, then the fds' access modes."""
        if src.kind == "dir" or dst.kind == "dir":
            return E.EISDIR
        readable = self.access[(ex.rec.thread, ex.f("from_fd"))][0]
        dst = (ex.rec.thread, ex.f("fd"))
        writable, append = self.access[dst][1], self.fds[dst][2]
        return None if readable and writable and not append else E.EBADF

    def copy_range(self, ex: Exec, src: Inode, start: int, dst: Inode, at: int, count: int) -> None:
        """DST's bytes AT.. AT+COUNT become SRC's START.. as they are now (holes stay holes):
        the same pattern sources, shifted, so the checks read them as any write's."""
        self.place(ex, src.content.get(start, start + count), start, dst, at, count)

    def place(self, ex: Exec, pieces: list[Piece], start: int, dst: Inode, at: int, count: int) -> None:
        """copy_range of PIECES, SRC's content START.. START+COUNT taken earlier."""
        shift = at - start
        cur = start
        for s, t, piece in pieces:
            if s > cur:
                self.data(ex, dst, cur + shift, s + shift, None)
            self.data(ex, dst, s + shift, t + shift, piece.shifted(shift) if piece else None)
            cur = t
        if cur < start + count:
            self.data(ex, dst, cur + shift, start + count + shift, None)
        if dst.size < at + count:
            self.resize(ex, dst, at + count)

    def op_close(self, ex: Exec) -> None:
        key = (ex.rec.thread, ex.f("fd"))
        if key in self.fds and self.batches:
            self.close_batch(ex, self.fds[key][0], self.access[key][1])
        self.fds.pop(key, None)
        self.access.pop(key, None)

    def op_write(self, ex: Exec) -> None:
        ino, osync, append = self.fd_inode(ex)
        if ino is None or ino.kind != "file":
            return
        if not ex.ok:
            self.failed_write(ex, ino, append)
            return
        start = ex.rec.aux  # a short write is legal: the model follows what was written
        delta = 0
        if append and ex.kind == "pwrite":
            # pwrite(2), BUGS: with O_APPEND, Linux appends whatever the offset;
            # the data is still the pattern generated for the requested offset.
            size = self.batch_size(ino) if self.batches else ino.size  # in a batch: its size in memory
            start, delta = size, size - ex.rec.aux
        src = Src(ex.f("file"), ex.op.seq, ex.rec.iter, delta)
        if self.batches and self.batched(ino, start, start + ex.rec.ret, src):
            return  # an f2fs atomic batch's: the file's at its commit (checkers/f2fs_batches.py)
        self.data(ex, ino, start, start + ex.rec.ret, src)
        if osync:  # generic_write_sync syncs the written range only
            self.persists.append(Persist(ex, "osync-write", ino.ino, ex.pos + 1, (start, start + ex.rec.ret)))

    op_pwrite = op_write

    def op_pwritev2(self, ex: Exec) -> None:
        """pwritev2(2): the executor records where the data landed (the fd's
        position for offset -1, the end of file with O_APPEND/RWF_APPEND) and
        writes the pattern for that offset. RWF_DSYNC/RWF_SYNC make the range
        durable like an O_DSYNC/O_SYNC fd; RWF_ATOMIC marks it untorn."""
        ino, osync, append = self.fd_inode(ex)
        if ino is None or ino.kind != "file":
            return
        flags = set(ex.f("flags") or ())
        if "RWF_ATOMIC" in flags and ino.ino in self.statx and ex.ok:
            why = untorn_refusal(self.statx[ino.ino], int(ex.f("length")), ex.rec.aux,
                                 append or "RWF_APPEND" in flags)
            if why:
                self.disagreements.append(Disagreement(ex, f"expected the write refused ({why}), "
                                                           f"the kernel wrote {ex.rec.ret} bytes"))
        if not ex.ok:
            self.failed_write(ex, ino, False)
            return
        start, end = ex.rec.aux, ex.rec.aux + ex.rec.ret
        self.data(ex, ino, start, end, Src(ex.f("file"), ex.op.seq, ex.rec.iter), "RWF_ATOMIC" in flags)
        if end > start and (osync or flags & RWF_SYNC_FLAGS):
            rule = "osync-write" if osync else "rwf-sync-write"
            self.persists.append(Persist(ex, rule, ino.ino, ex.pos + 1, (start, end)))

    def op_statx(self, ex: Exec) -> None:
        path = self.path(ex, "path")
        ino = self.lookup(path) if path else None
        if ino is not None and ex.rec.statx is not None and ex.rec.statx.write_atomic_answered:
            self.statx[ino.ino] = ex.rec.statx

    def failed_write(self, ex: Exec, ino: Inode, append: bool) -> None:
        """write(2) promises nothing about the file after an error, and Linux
        does leave data behind: on ext4 an O_DIRECT write whose length is
        misaligned writes its aligned first block, then returns EINVAL (iomap
        submits per mapped extent and reports the error, not the bytes done;
        tests/workloads/failed_direct_write.json). Its bytes are therefore
        allowed, never required, in its range from then on."""
        if ex.rec.skipped or ex.rec.errno == E.EBADF:  # never started / fd not writable
            return
        start, length = ex.rec.aux, int(ex.f("length") or 0)
        places = {(start, 0)}
        if append:  # or at the end of the file, with either offset's pattern
            places |= {(ino.size, 0), (ino.size, ino.size - start)}
        for at, delta in sorted(places) if length > 0 else ():
            ino.events.append(DataEvent(ex.pos, "maybe", at, at + length,
                                        Src(ex.f("file"), ex.op.seq, ex.rec.iter, delta), ino.size))

    def op_mmap_write(self, ex: Exec) -> None:
        ino, _, _ = self.fd_inode(ex)
        if ino is not None and ex.rec.flags & FLAG_SIGBUS:
            # The copy faulted part-way (the range passes EOF): memcpy stores in no
            # set order, so an unknown part of the mapped pages holds new data.
            self.uncertain |= {p for p, i in self.ns.items() if i == ino.ino}
            return
        if ino is None or not ex.ok or ino.kind != "file":
            return
        start = ex.rec.aux
        end = min(start + ex.f("length"), ino.size)  # a mapping cannot extend the file
        self.data(ex, ino, start, end, Src(ex.f("file"), ex.op.seq, ex.rec.iter))
        if ex.f("msync") and end > start:
            self.persists.append(Persist(ex, "msync-data", ino.ino, ex.pos + 1, (start, end)))

    def op_fallocate(self, ex: Exec) -> None:
        ino, _, _ = self.fd_inode(ex)
        if ino is None or not ex.ok or ino.kind != "file":
            return
        mode = set(ex.f("flags") or ())
        off, length = ex.rec.aux, ex.f("length")
        end = off + length
        if "PUNCH_HOLE" in mode:
            self.data(ex, ino, off, min(end, ino.size), None)
        elif "COLLAPSE_RANGE" in mode:
            ino.content.collapse(off, length)
            ino.size -= length
            ino.events.append(DataEvent(ex.pos, "collapse", off, end, None, ino.size))
        elif "INSERT_RANGE" in mode:
            ino.content.insert(off, length)
            ino.size += length
            ino.events.append(DataEvent(ex.pos, "insert", off, end, None, ino.size))
        elif "ZERO_RANGE" in mode:
            self.data(ex, ino, off, end, None)
            if "KEEP_SIZE" not in mode and end > ino.size:
                self.resize(ex, ino, end)
        elif "UNSHARE_RANGE" not in mode:
            if "KEEP_SIZE" not in mode and end > ino.size:
                self.resize(ex, ino, end)
            # the blocks stay allocated (fallocate-fsync checks them after an fsync)
            ino.events.append(DataEvent(ex.pos, "alloc", off, end, None, ino.size))

    def op_ftruncate(self, ex: Exec) -> None:
        ino, _, _ = self.fd_inode(ex)
        if ino is not None and ex.ok and ino.kind == "file":
            self.resize(ex, ino, ex.f("length"))

    def op_truncate(self, ex: Exec) -> None:
        path = self.path(ex, "path")
        if path is None:
            return
        ino = self.lookup(path)
        if ino is None or self.dotted(ex, "path") and ino.kind != "dir":
            self.predict(ex, self.missing(path) if ino is None else E.ENOTDIR)
        else:
            self.predict(ex, E.EISDIR if ino.kind == "dir" else None)
        if ino is not None and ex.ok and ino.kind == "file":
            self.resize(ex, ino, ex.f("length"))

    def op_fsync(self, ex: Exec) -> None:
        self.op_fsync_as(ex, PERSIST_INODE[ex.kind])

    def op_fsync_as(self, ex: Exec, rule: str) -> None:
        ino, _, _ = self.fd_inode(ex)
        if ino is not None and ex.ok:
            self.persists.append(Persist(ex, rule, ino.ino, self.prefix_before(ex)))

    op_fdatasync = op_fsync

    def op_sync(self, ex: Exec) -> None:
        if ex.ok:
            self.persists.append(Persist(ex, "sync-all", None, self.prefix_before(ex)))

    op_syncfs = op_sync

    def prefix_before(self, ex: Exec) -> int:
        """Ops at positions below this had all returned before EX was called: the first
        position whose op returned at or after EX's start (at most EX's own). By bisection
        on the running maximum of the end times (a walk from 0 per fsync took minutes
        over fsync-under-load's millions of ops)."""
        if self._ended_by is None:
            self._ended_by = list(itertools.accumulate((x.rec.end_ns for x in self.execs), max))
        return min(ex.pos, bisect.bisect_left(self._ended_by, ex.rec.start_ns))

    def op_mkdir(self, ex: Exec) -> None:
        path = self.path(ex, "path", follow=False)
        if path is None:
            return
        if self.dotted(ex, "path"):  # filename_create: a last "." exists (EEXIST) once the walk succeeds
            self.predict(ex, self.dir_errno(path) or E.EEXIST)
            return
        self.predict(ex, E.EEXIST if path in self.ns else (None if self.parent_ok(path) else self.missing(path)))
        if ex.ok:
            self.change_names(ex.pos, {path: self.new_inode("dir", ex.pos).ino})

    def op_rmdir(self, ex: Exec) -> None:
        path = self.path(ex, "path", follow=False)
        if path is None:
            return
        if self.dotted(ex, "path"):  # do_rmdir: a last "." is EINVAL (rmdir(2)) once the walk succeeds
            self.predict(ex, self.dir_errno(path) or E.EINVAL)
            return
        ino = self.lookup(path)
        if ino is None:
            self.predict(ex, self.missing(path))
        elif ino.kind != "dir":
            self.predict(ex, E.ENOTDIR)
        elif self.children(path):
            self.predict(ex, E.ENOTEMPTY)
        else:
            self.predict(ex, None)
        if ex.ok:
            self.change_names(ex.pos, {path: None})

    def op_unlink(self, ex: Exec) -> None:
        path = self.path(ex, "path", follow=False)
        if path is None:
            return
        if self.dotted(ex, "path"):  # do_unlinkat: a last component that is not a name is EISDIR
            self.predict(ex, self.dir_errno(path) or E.EISDIR)
            return
        ino = self.lookup(path)
        self.predict(ex, self.missing(path) if ino is None else (E.EISDIR if ino.kind == "dir" else None))
        if ex.ok:
            self.change_names(ex.pos, {path: None})

    def op_link(self, ex: Exec) -> None:
        src, dst = self.two_paths(ex)
        if src is None or dst is None:
            return
        if src in self.uncertain:
            self.uncertain.add(dst)  # the same inode, as little known under its new name
        ino = self.lookup(src)
        if self.dotted(ex, "from") and ino is not None and ino.kind != "dir":
            ino = None  # "foo/.": the walk fails (ENOTDIR, from missing())
        # Error precedence (fs/namei.c do_linkat): the source is looked up first, then
        # the new name's parent (filename_create: ENOENT/ENOTDIR, then EEXIST), and
        # only vfs_link refuses a directory (EPERM): link(dir, missing/x) is ENOENT.
        src_err = (self.dir_errno(src) if self.dotted(ex, "from") else self.missing(src)) if ino is None else None
        self.predict(ex, src_err or self.new_link_errno(ino, dst, self.dotted(ex, "to")))  # type: ignore[arg-type]
        if ex.ok and ino is not None:
            self.change_names(ex.pos, {dst: ino.ino})

    def new_link_errno(self, ino: Inode, dst: str, dot: bool = False) -> int | None:
        """What giving INO the new name DST returns once the source is found (fs/namei.c
        filename_create, then vfs_link): DST's parent (ENOENT/ENOTDIR), DST taken (EEXIST;
        a last "." always is), a directory (EPERM), a file with no name left that is no
        linkable tmpfile (ENOENT)."""
        if dot:
            return self.dir_errno(dst) or E.EEXIST
        parent = self.parent_errno(dst)
        if parent:
            return parent
        if dst in self.ns:
            return E.EEXIST
        if ino.kind == "dir":
            return E.EPERM
        if ino.ino not in self.ns.values() and ino.ino not in self.linkable:
            return E.ENOENT
        return None

    def op_symlink(self, ex: Exec) -> None:
        path = self.path(ex, "path", follow=False)
        if path is None:
            return
        if self.dotted(ex, "path"):  # filename_create, as for mkdir
            self.predict(ex, self.dir_errno(path) or E.EEXIST)
            return
        self.predict(ex, E.EEXIST if path in self.ns else (None if self.parent_ok(path) else self.missing(path)))
        if ex.ok:
            self.change_names(ex.pos, {path: self.new_inode("symlink", ex.pos, ex.f("target")).ino})

    def op_rename(self, ex: Exec) -> None:
        src, dst = self.two_paths(ex)
        if src is None or dst is None:
            return
        if src in self.uncertain or any(u.startswith(src + "/") for u in self.uncertain):
            self.uncertain.add(dst)  # what the model lost at or under src moves along
        flags = set(ex.f("flags") or ())
        s, d = self.lookup(src), self.lookup(dst)
        # Not judged: WHITEOUT; the root; directories with a name under them the model lost.
        lost_under = any(u.startswith((src + "/", dst + "/")) for u in self.uncertain)
        dots = self.dotted(ex, "from"), self.dotted(ex, "to")
        if any(dots) and flags <= {"NOREPLACE", "EXCHANGE"} and not lost_under:
            self.predict(ex, self.dot_rename_errno(src, dst, dots, flags))
            return
        if ROOT not in (src, dst) and flags <= {"NOREPLACE", "EXCHANGE"} and not lost_under:
            self.predict(ex, self.rename_errno(src, dst, s, d, flags))
        if not ex.ok or s is None:
            if ex.ok:  # the kernel did something the model cannot follow
                self.uncertain |= {src, dst}
            return
        updates: dict[str, int | None] = {}
        if "EXCHANGE" in flags and d is not None:
            moves = [(src, dst), (dst, src)]
            # The names under each side go with it: none stays where it was unless the
            # other side brings the same name (exchange(dir A, file foo) leaves no A/C).
            updates.update({child: None for a in (src, dst) for child in self.children(a)})
        elif src == dst or s is d:
            return
        else:
            moves = [(src, dst)]
            updates[src] = None
            for child in self.children(dst):
                updates[child] = None
        for a, b in moves:
            updates[b] = self.ns[a]
            for child in self.children(a):
                updates[b + child[len(a):]] = self.ns[child]
                if "EXCHANGE" not in flags:
                    updates[child] = None
        self.change_names(ex.pos, updates)

    def dot_rename_errno(self, src: str, dst: str, dots: tuple[bool, bool], flags: set[str]) -> int:
        """renameat2 with a last "." on either side (fs/namei.c do_renameat2): both walks
        first (the old, then the new; for a "." side the directory it names is the parent),
        then the old side's "." is EBUSY, the new side's EEXIST under NOREPLACE, else EBUSY."""
        if flags == {"NOREPLACE", "EXCHANGE"}:
            return E.EINVAL
        for path, dot in zip((src, dst), dots):
            err = self.dir_errno(path) if dot else self.parent_errno(path)
            if err:
                return err
        return E.EEXIST if not dots[0] and "NOREPLACE" in flags else E.EBUSY

    def rename_errno(self, src: str, dst: str, s: Inode | None, d: Inode | None,
                     flags: set[str]) -> int | None | tuple[int, ...]:
        """What renameat2(SRC, DST, FLAGS) returns, in the kernel's order of checks
        (fs/namei.c do_renameat2, then vfs_rename): both parents are resolved (old, then
        new: ENOENT/ENOTDIR) before SRC is looked up (ENOENT); NOREPLACE with DST
        present is EEXIST, EXCHANGE with DST missing ENOENT; then the ancestor checks
        (SRC above DST: EINVAL; DST above SRC: ENOTEMPTY, EINVAL when exchanging);
        then may_delete on the target (a file over a directory EISDIR, a directory over
        a non-directory ENOTDIR); a nonempty target directory is refused by the file
        system (ext4/btrfs ENOTEMPTY, xfs EEXIST: rename(2) allows either). NOREPLACE
        together with EXCHANGE is EINVAL before any lookup."""
        if flags == {"NOREPLACE", "EXCHANGE"}:
            return E.EINVAL
        parents = self.parent_errno(src) or self.parent_errno(dst)
        if parents:
            return parents
        if s is None:
            return E.ENOENT
        if "NOREPLACE" in flags and d is not None:
            return E.EEXIST
        if "EXCHANGE" in flags and d is None:
            return E.ENOENT
        if dst.startswith(src + "/"):
            return E.EINVAL
        if src.startswith(dst + "/"):
            return E.EINVAL if "EXCHANGE" in flags else E.ENOTEMPTY
        if "EXCHANGE" in flags or d is None or d is s:
            return None
        if s.kind != "dir" and d.kind == "dir":
            return E.EISDIR
        if s.kind == "dir" and d.kind != "dir":
            return E.ENOTDIR
        if s.kind == "dir" and self.children(dst):
            return (E.ENOTEMPTY, E.EEXIST)
        return None

    def op_setxattr(self, ex: Exec) -> None:
        """COUNT setxattr calls as one op: the executor stops at the first failure (ext4's
        ENOSPC when the inode and its xattr block are full, E2BIG, ...) and records in aux
        how many it set; exactly those are applied, each with the op's value."""
        path = self.path(ex, "path")
        ino = self.lookup(path) if path else None
        done = (ex.f("count") or 1) if ex.ok else 0 if ex.rec.skipped else ex.rec.aux
        if ino is None or not done:
            return
        cur = dict(ino.xattrs_at(ex.pos + 1))
        for name in xattr_names(ex.f("name"), done):
            cur[name] = (ex.f("file"), ex.op.seq, ex.rec.iter, ex.f("length"))
        ino.xattrs.append((ex.pos, cur))

    def op_fsetxattr(self, ex: Exec) -> None:
        """One xattr set through an fd, with XATTR_CREATE / XATTR_REPLACE. setxattr(2): CREATE
        fails with EEXIST if the name exists, REPLACE with ENODATA if it does not (both: one of
        them always); ext4 (ext4_xattr_set_handle), xfs (xfs_attr_set), btrfs (btrfs_setxattr)
        and f2fs (__f2fs_setxattr) look the name up before any space check, so that answer comes
        first. Without a flag the model predicts no errno (ENOSPC, E2BIG are the fs's call). Its
        durability is setxattr's: the file's xattrs (fsync, ordered-metadata)."""
        ino, _, _ = self.fd_inode(ex)
        if ino is None or ex.rec.skipped:
            return
        cur = dict(ino.xattrs_at(ex.pos + 1))
        name, flags = ex.f("name"), set(ex.f("flags") or ())
        if "CREATE" in flags and name in cur:
            self.predict(ex, E.EEXIST)
        elif "REPLACE" in flags and name not in cur:
            self.predict(ex, E.ENODATA)
        elif not ex.ok and ex.rec.errno in (E.EEXIST, E.ENODATA):
            self.predict(ex, None)  # a flag's answer where the name says otherwise
        if ex.ok:
            cur[name] = (ex.f("file"), ex.op.seq, ex.rec.iter, ex.f("length"))
            ino.xattrs.append((ex.pos, cur))

    def op_removexattr(self, ex: Exec) -> None:
        path = self.path(ex, "path")
        ino = self.lookup(path) if path else None
        if ino is None or not ex.ok:
            return
        cur = dict(ino.xattrs_at(ex.pos + 1))
        cur.pop(ex.f("name"), None)
        ino.xattrs.append((ex.pos, cur))


BLOCK = 4096  # the block size of every file system powercut makes (mkfs.ext4 -b 4096; xfs and btrfs defaults on x86)


def clone_range(size_in: int, size_out: int, pos_in: int, pos_out: int, length: int,
                same: bool) -> tuple[int | None, int]:
    """(errno or None, bytes cloned) of a clone of LENGTH (0: to the end) from POS_IN of a
    file of SIZE_IN to POS_OUT of one of SIZE_OUT, as fs/remap_range.c decides without
    REMAP_FILE_CAN_SHORTEN (FICLONE, FICLONERANGE)."""
    if length == 0:
        if pos_in == size_in:
            return None, 0
        if pos_in > size_in:
            return E.EINVAL, 0
        length = size_in - pos_in
    if pos_in % BLOCK or pos_out % BLOCK or pos_in >= size_in:
        return E.EINVAL, 0
    count = min(length, size_in - pos_in)
    if pos_in + count == size_in:
        span = -(-size_in // BLOCK) * BLOCK - pos_in   # the partial last block goes whole
    else:
        count -= count % BLOCK
        span = count
    if same and pos_out + span > pos_in and pos_out < pos_in + span:
        return E.EINVAL, 0
    if count != length:
        return E.EINVAL, 0
    if count % BLOCK and pos_out + count < size_out:
        return E.EINVAL, 0
    return None, count


def exchange_range_check(size1: int, size2: int, off1: int, off2: int, length: int, to_eof: bool,
                         same: bool) -> tuple[int | None, int, int]:
    """(errno or None, bytes of file1 that go to file2, bytes of file2 that go to file1) of
    an exchange of LENGTH bytes at OFF1 of a file of SIZE1 and OFF2 of one of SIZE2, as
    fs/xfs/xfs_exchrange.c xfs_exchange_range_checks decides with the block as the
    allocation unit: no range may start past its file's end; TO_EOF runs both ranges to
    their files' ends (the longer one sets the length), else both must end within EOF;
    offsets block-aligned; the length too unless both ranges end at EOF (a partial last
    block goes whole), and a partial last block never lands in the middle of a file;
    ranges of one file may not overlap. A length of 0 does nothing and succeeds."""
    if off1 > size1 or off2 > size2:
        return E.EINVAL, 0, 0
    if to_eof:
        length = max(size1 - off1, size2 - off2)
    elif off1 + length > size1 or off2 + length > size2:
        return E.EINVAL, 0, 0
    if off1 % BLOCK or off2 % BLOCK:
        return E.EINVAL, 0, 0
    if off1 + length == size1:
        span = -(-size1 // BLOCK) * BLOCK - off1
    elif off2 + length == size2:
        span = -(-size2 // BLOCK) * BLOCK - off2
    elif length % BLOCK:
        return E.EINVAL, 0, 0
    else:
        span = length
    if same and off2 + span > off1 and off1 + span > off2:
        return E.EINVAL, 0, 0
    if length % BLOCK:
        cut = length
        if off2 + cut < size2:
            cut -= cut % BLOCK
        if off1 + cut < size1:
            cut -= cut % BLOCK
        if cut != length:
            return E.EINVAL, 0, 0
    if length == 0:
        return None, 0, 0
    if to_eof:
        return None, size1 - off1, size2 - off2
    return None, length, length


def untorn_refusal(st: StatxResult, length: int, offset: int, append: bool) -> str | None:
    """Why the kernel must refuse an RWF_ATOMIC write of LENGTH at OFFSET to a file
    with the statx limits ST, or None. Kernel commit c34fc6f26ab8: a file that cannot
    do untorn writes rejects RWF_ATOMIC rather than ignoring it; the length must be
    a power of two within the unit min..max, the offset naturally aligned (not
    judged for appends: the kernel moves the offset to the end of file first)."""
    if st.inexact:
        return None
    if not st.attr_write_atomic:
        return "statx: the file has no STATX_ATTR_WRITE_ATOMIC"
    if length & (length - 1) or not st.atomic_unit_min <= length <= st.atomic_unit_max:
        return f"length {length} is not a power of two in [{st.atomic_unit_min}, {st.atomic_unit_max}]"
    if not append and offset % length:
        return f"offset {offset} is not a multiple of the length {length}"
    return None


def build_history(plan: Plan, results: Results, marks: list[tuple[int, str]],
                  reflink: bool | None = None, exchange: bool | None = None) -> History:
    """MARKS: (log index, text) of every mark in the log. REFLINK: whether the file
    system clones (None: not known; the model then takes either answer of a clone);
    EXCHANGE: the same for exchange_range."""
    ops = plan.by_seq()
    done = completion_marks(marks)
    recs = [r for r in results.records if r.kind not in ("repeat",)]
    # Completion order; ops never marked (the executor died) go last, in time order.
    keyed = sorted(recs, key=lambda r: (done.get((r.thread, r.seq, r.iter), 1 << 62), r.end_ns))
    execs = [Exec(i, r, ops[r.seq][1], done.get((r.thread, r.seq, r.iter))) for i, r in enumerate(keyed)]
    b = HistoryBuilder(plan, execs, reflink, exchange)
    for ex in execs:
        b.apply(ex)
    other_orders(execs, b.inodes)
    threads: dict[int, list[int]] = {}
    for ex in sorted(execs, key=lambda e: (e.rec.thread, e.rec.start_ns)):
        threads.setdefault(ex.rec.thread, []).append(ex.pos)
    return History(plan, execs, b.inodes, b.ns_list, b.persists, b.name_changes, b.uncertain, b.lost,
                   b.disagreements, threads)
