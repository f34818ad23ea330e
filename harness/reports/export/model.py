"""What the exported ops leave in the file system after each of them: the
expectation an export's checks (checks.py) are written from.

The model is the oracle's own (checkers/history.py): the ops become a plan
(workloads/plan.py, as the executor would run them) and each op a record
whose result is the one history.py predicts for it (an op it says must fail
fails here, and changes nothing), so names, sizes, bytes, link counts and
xattrs follow the same semantics the oracle judged the finding by. What an
export adds: its data bytes (op number I writes the byte 'a' + I % 26:
pc-repro.c and the fstests export's `pwrite -S` agree), the fds' positions
(the executor records where each write landed; here nobody ran it), and a
view per op: states[k] is the file system after the first k ops returned; a
power cut right after op k may show, for a fact a completed fsync covers,
only what one of states[g..k] shows (g: the op that made it durable).

An op the export cannot follow exactly (collapse and insert ranges shift
bytes; an unaligned O_DIRECT write fails or falls back to buffered I/O as
the file system decides) marks its inode inexact: no size or byte check is
written for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from checkers.history import ROOT, HistoryBuilder
from checkers.timeline import Exec
from checkers.timeline import Inode as HInode
from workloads.format import parse_workload, workload_doc
from workloads.plan import build_plan
from workloads.results import FLAG_SKIPPED, OpRecord

SECTOR = 4096


def fill(i: int) -> int:
    """The byte op number I writes."""
    return ord("a") + i % 26


@dataclass
class Inode:
    """One file as a state shows it."""
    kind: str                                  # file, dir, symlink
    data: bytes = b""
    xattrs: dict[str, bytes] = dataclasses.field(default_factory=dict)
    target: str = ""
    exact: bool = True
    writers: set[int] = dataclasses.field(default_factory=lambda: {0})   # byte values ever in the file


@dataclass
class _Fd:
    """An export's fd: its slot in the history's fd table, which keeps its modes, and its position."""
    b: HistoryBuilder
    slot: int
    pos: int

    @property
    def write(self) -> bool:
        return self.b.access[(0, self.slot)][1]

    @property
    def append(self) -> bool:
        return self.b.fds[(0, self.slot)][2]

    @property
    def direct(self) -> bool:
        return self.b.access[(0, self.slot)][2]


class State:
    """The file system after the first K ops, read from the oracle's history on demand."""

    def __init__(self, model: "Model", k: int) -> None:
        self.m, self.k = model, k
        self.names = {p: i for p, i in model.b.ns_list[k].items() if p != ROOT}

    def kind(self, path: str) -> str:
        ino = self.names.get(path)
        return "absent" if ino is None else self.m.b.inodes[ino].kind

    def inode(self, path: str) -> Inode | None:
        ino = self.names.get(path)
        return None if ino is None else self.m.view(ino, self.k)

    def nlink(self, path: str) -> int:
        ino = self.names.get(path)
        return sum(1 for i in self.names.values() if i == ino)


class Model:
    """The oracle's history of OPS (one thread's, or several threads' serialised), op by op."""

    def __init__(self, ops: list[dict[str, Any]]) -> None:
        self.ops = ops
        self.plan = [op for _, op in build_plan(parse_workload(workload_doc(ops))).ops()]
        self.b = _Predicting([])
        self.fds: dict[str, _Fd] = {}
        self.inexact: dict[int, int] = {}     # inode -> the first op it is inexact after
        self.applied = 0

    def inode_at(self, path: str) -> HInode | None:
        return self.b.lookup(path)

    def apply(self, i: int, op: dict[str, Any]) -> None:
        """Op I (OP, the I-th of the ops given): its record as history.py predicts it, applied."""
        pop = self.plan[i]
        fd = self.fds.get(op.get("fd", ""))
        ino = self.b.inodes[self.b.fds[(0, fd.slot)][0]] if fd and (0, fd.slot) in self.b.fds else None
        ret, aux, flags = self._record(op, fd, ino)
        ex = Exec(i, OpRecord(0, pop.seq, 0, op["op"], None, 2 * i, 2 * i + 1, ret, 0, flags, aux), pop, None)
        self.b.execs.append(ex)
        self.b.apply(ex)
        self._follow(op, ex, fd, ino)
        self.applied += 1

    def _record(self, op: dict[str, Any], fd: _Fd | None, ino: HInode | None) -> tuple[int, int, int]:
        """(ret, aux, flags) the executor would record: where a write lands, how much it writes."""
        k = op["op"]
        writes = k in ("write", "pwrite", "pwritev2", "mmap_write", "fallocate", "ftruncate", "copy_file_range",
                       "clone")
        usable = fd is not None and ino is not None and (fd.write or not writes)
        src = self.fds.get(op.get("from_fd", ""))
        if "fd" in op and k not in ("open", "creat") and not usable or "from_fd" in op and src is None:
            return -1, 0, FLAG_SKIPPED     # its open failed, or the fd is not open for writing: EBADF
        if k == "copy_file_range":
            # what the kernel copies: up to the source's end (history.py judges the errors)
            size = self.b.inodes[self.b.fds[(0, src.slot)][0]].size if (0, src.slot) in self.b.fds else 0
            return max(0, min(op["length"], size - op["from_offset"])), op["offset"], 0
        if k == "clone" and ino is not None:
            # refused where the file system has no shared extents (EOPNOTSUPP, ext4): its call
            self.inexact.setdefault(ino.ino, self.applied + 1)
        if k in ("write", "pwrite", "pwritev2", "mmap_write", "read", "pread"):
            assert fd is not None and ino is not None   # usable
            length = sum(op["iov"]) if k == "pwritev2" else op["length"]
            off = op.get("offset", -1)
            at = fd.pos if off is None or off < 0 else off
            if fd.append and k in ("write", "pwritev2"):
                at = ino.size
            if k in ("read", "pread"):
                return max(0, min(length, ino.size - at)), at, 0
            if k != "mmap_write" and fd.direct and (at % SECTOR or length % SECTOR):
                # Unaligned O_DIRECT: EINVAL, a buffered fallback (ext4), part of it: the file system's call
                self.inexact.setdefault(ino.ino, self.applied + 1)
                return -1, at, FLAG_SKIPPED
            return length, at, 0
        if k == "fallocate":
            if set(op["mode"]) & {"COLLAPSE_RANGE", "INSERT_RANGE"} and ino is not None:
                self.inexact.setdefault(ino.ino, self.applied + 1)
            return 0, op["offset"], 0
        return 0, op.get("offset", 0), 0

    def _follow(self, op: dict[str, Any], ex: Exec, fd: _Fd | None, ino: HInode | None) -> None:
        """The fd table and positions after EX (history.py keeps inodes, not positions)."""
        k = op["op"]
        if k in ("open", "creat") and ex.ok and (0, ex.f("fd")) in self.b.fds:
            self.fds[op["fd"]] = _Fd(self.b, ex.f("fd"), 0)
        elif k == "close":
            self.fds.pop(op["fd"], None)
        elif fd is not None and ex.ok and (k in ("write", "read") or (k == "pwritev2" and op.get("offset", -1) < 0)):
            fd.pos = ex.rec.aux + ex.rec.ret

    def view(self, ino_n: int, k: int) -> Inode:
        ino = self.b.inodes[ino_n]
        content, size = ino.content_at(k)
        data = bytearray(size)
        writers = {0}
        for s, e, src in content.get(0, size):
            if src is not None:
                data[s:e] = bytes([fill(src.seq)]) * (e - s)
        for ev in ino.events:
            if ev.pos < k and ev.kind == "data" and ev.src is not None:
                writers.add(fill(ev.src.seq))
        xattrs = {n: bytes([fill(seq)]) * length for n, (_, seq, _, length) in ino.xattrs_at(k).items()}
        exact = ino_n not in self.inexact or self.inexact[ino_n] > k
        return Inode(ino.kind, bytes(data), xattrs, ino.target, exact, writers)

    def states(self) -> list[State]:
        return [State(self, k) for k in range(self.applied + 1)]

    def run(self) -> list[State]:
        for i, op in enumerate(self.ops):
            self.apply(i, op)
        return self.states()


class _Predicting(HistoryBuilder):
    """history.py's builder, with each op's result its own prediction: an op it says must
    fail gets that errno before it is applied (its handlers predict, then apply if ok)."""

    def __init__(self, execs: list[Exec]) -> None:
        super().__init__(None, execs)  # type: ignore[arg-type]  # the plan is not consulted

    def predict(self, ex: Exec, expected: int | None | tuple[int, ...]) -> None:
        first = expected[0] if isinstance(expected, tuple) else expected
        if first:
            ex.rec = dataclasses.replace(ex.rec, ret=-1, errno=first)

    def prefix_before(self, ex: Exec) -> int:
        return ex.pos  # one op after the other: every earlier op had returned


def states_of(ops: list[dict[str, Any]]) -> list[State]:
    return Model(ops).run()

