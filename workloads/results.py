"""Reading the records file pc-exec writes (layout: workloads/executor/records.c)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from foundation.errors import UsageError
from workloads.format import Workload
from workloads.plan import Plan, build_plan

MAGIC = b"PCEXREC1"
VERSION = 1
_HEAD = struct.Struct("<8sIIIIQIIQQQQ")
_THREAD = struct.Struct("<II")
_RECORD = struct.Struct("<IIHHiqQQq")
FLAG_DEADLINE_MISS = 1  # repeat iteration: started > 1 period late or ran past its slot
FLAG_SKIPPED = 2        # fd's open had failed: EBADF recorded without a syscall
FLAG_SIGBUS = 4         # mmap_write's copy faulted: EFAULT recorded
# Kinds whose record carries the file offset the op used (in `aux`).
OFFSET_KINDS = frozenset(("write", "pwrite", "read", "pread", "fallocate", "sync_file_range", "mmap_write",
                          "pwritev2"))


@dataclass(frozen=True)
class StatxResult:
    """The untorn-write and direct I/O limits a statx op read (0: none reported).
    Packed into the record's aux by workloads/executor/untorn.c."""

    atomic_unit_min: int
    atomic_unit_max: int
    atomic_unit_max_opt: int
    atomic_segments_max: int
    dio_mem_align: int
    dio_offset_align: int
    write_atomic_answered: bool     # STATX_WRITE_ATOMIC in the returned mask
    dioalign_answered: bool
    attr_write_atomic: bool         # STATX_ATTR_WRITE_ATOMIC: the file can do untorn writes
    inexact: bool                   # a value was not a power of two (rounded down)

    @classmethod
    def unpack(cls, aux: int) -> StatxResult:
        b = [(aux >> (8 * i)) & 0xFF for i in range(7)]
        size = [0 if c == 0 else 1 << (c - 1) for c in b]
        return cls(size[0], size[1], size[2], b[3], size[4], size[5],
                   bool(b[6] & 1), bool(b[6] & 2), bool(b[6] & 4), bool(b[6] & 8))

    @property
    def atomic_supported(self) -> bool:
        return self.attr_write_atomic and self.atomic_unit_min > 0 and self.atomic_unit_max >= self.atomic_unit_min

    def to_json(self) -> dict[str, int | bool]:
        return dict(vars(self))


@dataclass(frozen=True)
class OpRecord:
    """One timed op, or one iteration of a repeat (kind "repeat", its body's span)."""

    thread: int
    seq: int
    iter: int
    kind: str
    op_id: str | None
    start_ns: int
    end_ns: int
    ret: int
    errno: int
    flags: int
    aux: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def skipped(self) -> bool:
        return bool(self.flags & FLAG_SKIPPED)

    @property
    def deadline_miss(self) -> bool:
        return bool(self.flags & FLAG_DEADLINE_MISS)

    @property
    def late_ns(self) -> int | None:
        """How late a repeat iteration started after its due time."""
        return self.aux if self.kind == "repeat" else None

    @property
    def statx(self) -> StatxResult | None:
        """What a successful statx op read."""
        return StatxResult.unpack(self.aux) if self.kind == "statx" and self.ret >= 0 else None

    @property
    def offset(self) -> int | None:
        """The file offset a data/range op worked at (for write/read: the position before it)."""
        return self.aux if self.kind in OFFSET_KINDS else None


@dataclass(frozen=True)
class Results:
    wid: int
    thread_names: tuple[str, ...]
    overhead_min_ns: int     # back-to-back clock_gettime pair
    overhead_median_ns: int
    start_ns: int            # CLOCK_MONOTONIC when the threads were released
    end_ns: int              # ... and when the last one finished
    mark_failures: int
    records: tuple[OpRecord, ...]


def read_records(path: str | Path, plan: Plan | Workload) -> Results:
    """The records of PATH, op kinds resolved through PLAN (or the workload's plan)."""
    if isinstance(plan, Workload):
        plan = build_plan(plan)
    data = Path(path).read_bytes()
    if len(data) < _HEAD.size or data[:8] != MAGIC:
        raise UsageError(f"{path}: not a pc-exec records file")
    (_, version, hsize, rsize, nthreads, nrecs, wid, mark_failures,
     ov_min, ov_med, start, end) = _HEAD.unpack_from(data)
    if version != VERSION or rsize != _RECORD.size or len(data) != hsize + nrecs * rsize:
        raise UsageError(f"{path}: records file version {version} or size does not match this powercut")
    if wid != plan.wid:
        raise UsageError(f"{path}: records of workload id {wid:#x}, not of {plan.name!r} ({plan.wid:#x})")
    names, pos = [], _HEAD.size
    for _ in range(nthreads):
        _, n = _THREAD.unpack_from(data, pos)
        names.append(data[pos + _THREAD.size:pos + _THREAD.size + n].decode())
        pos += _THREAD.size + n
    ops = plan.by_seq()
    records = []
    for seq, it, thread, flags, err, ret, t0, t1, aux in _RECORD.iter_unpack(data[hsize:]):
        if seq not in ops:
            raise UsageError(f"{path}: record of op {seq}, which the plan does not have")
        op = ops[seq][1]
        records.append(OpRecord(thread, seq, it, op.kind, op.id, t0, t1, ret, err, flags, aux))
    return Results(wid, tuple(names), ov_min, ov_med, start, end, mark_failures, tuple(records))
