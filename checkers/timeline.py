"""An executed op and an inode's timeline of content events: what the history
(checkers/history.py) builds and the passes over it (checkers/overlap.py,
checkers/eventindex.py) read, apart so that they need not import the builder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from foundation.intervals import IntervalMap, Src
from workloads.plan import PlanOp
from workloads.results import OpRecord


@dataclass
class Exec:
    """One executed op (one iteration of it inside a repeat)."""

    pos: int            # index in completion order
    rec: OpRecord
    op: PlanOp
    mark: int | None    # log index of its completion mark (None: never marked)

    @property
    def kind(self) -> str:
        return self.op.kind

    @property
    def ok(self) -> bool:
        return self.rec.ret >= 0 and not self.rec.skipped

    def f(self, name: str) -> Any:
        return self.op.fields.get(name)

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.op.fields.items()
                         if k not in ("file", "stride") and not (k == "count" and self.kind == "setxattr" and v == 1))
        it = f" iter {self.rec.iter}" if self.rec.iter else ""
        return f"{self.kind}({args}) [op {self.op.seq}{it}, thread {self.rec.thread}]"


@dataclass
class DataEvent:
    pos: int
    kind: str            # "data" | "zero" | "size" | "collapse" | "insert" | "maybe" | "alloc"
    start: int = 0
    end: int = 0
    src: Src | None = None
    size: int = 0        # the file size after the event
    untorn: bool = False  # an RWF_ATOMIC write: all old or all new at every crash state
    # A "maybe" of another order (checkers/overlap.py): allowed until an op sure to come after it
    # is in the guarantee's base (its position below the floor); None: a failed write's bytes,
    # allowed from then on. Its size is the file's size in that order.
    until: int | None = None
    # an f2fs atomic batch's write (checkers/f2fs_batches.py): the position of the batch's START;
    # the batch's writes are all old or all new together at every crash state
    batch: int | None = None


@dataclass
class Inode:
    ino: int
    kind: str                       # "file" | "dir" | "symlink"
    created: int                    # position of the creating op (-1: before the workload)
    target: str = ""                # symlink target
    events: list[DataEvent] = field(default_factory=list)
    xattrs: list[tuple[int, dict[str, tuple[int, int, int, int]]]] = field(default_factory=list)
    size: int = 0
    content: IntervalMap = field(default_factory=IntervalMap)

    def content_at(self, prefix: int) -> tuple[IntervalMap, int]:
        """Content map and size after the ops at positions < PREFIX."""
        return self.content_from(IntervalMap(), 0, 0, prefix)

    def content_from(self, m: IntervalMap, size: int, k: int, prefix: int) -> tuple[IntervalMap, int]:
        """Content map and size after the ops at positions < PREFIX, from M and SIZE
        (those after the first K events; M is changed in place)."""
        events = self.events
        for i in range(k, len(events)):
            e = events[i]
            if e.pos >= prefix:
                break
            if e.kind in ("data", "zero"):
                m.set(e.start, e.end, e.src)
            elif e.kind == "collapse":
                m.collapse(e.start, e.end - e.start)
            elif e.kind == "insert":
                m.insert(e.start, e.end - e.start)
            elif e.kind == "maybe":
                continue  # an outcome allowed, not the model's: its size is not the file's
            size = e.size
        return m, size

    def xattrs_at(self, pos: int) -> dict[str, tuple[int, int, int, int]]:
        """Xattrs (name -> (file_id, seq, iter, length)) after the ops before POS."""
        cur: dict[str, tuple[int, int, int, int]] = {}
        for p, x in self.xattrs:
            if p < pos:
                cur = x
        return cur
