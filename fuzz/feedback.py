"""Feedback for AFL++ without kernel coverage: features of a run, hashed into
AFL's shared-memory map.

The kernel has no kcov, so the target reports what it saw itself. Only
deterministic features, each hashed to a map index and counted (AFL++ turns
counts into hit buckets):

- (previous op, op, errno) for every op, in program order;
- (op, bucket of the flushes the device saw while the op ran);
- (file, bucket of its final size) from the model, and (file, bucket of its
  extent count) read with FIEMAP from the last recovered crash image;
- which (last persistence op completed before a crash point, the check
  outcome there: ok or the finding kinds) pairs occur;
- where the run has kernel coverage (vm backend: fuzz/coverage.py), each
  function of the file system's modules that ran, per path (workload,
  recovery), counted by its calls: the kernel's own map, as kcov's would be.

Nothing timing-dependent (latencies, log entry indices, how many crash
points or flushes exactly) goes in: writeback timing would show up as
instability. What remains (a background commit adding a flush, an extent
count crossing a bucket) is rare.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
import threading
import zlib
from collections import Counter
from collections.abc import Iterable

from checkers.findings import Finding
from fuzz.coverage import bucket, run_hits
from fuzz.trial import Trial
from replay.crashstates import CrashState
from replay.logformat import LogReader
from workloads.marks import parse_mark

DEFAULT_MAP_SIZE = 1 << 16
PERSIST = ("fsync", "fdatasync", "sync", "syncfs", "sync_file_range")
FS_IOC_FIEMAP = 0xC020660B
_FIEMAP = struct.Struct("=QQLLLL")  # fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count, reserved


class Extents:
    """An inspector for recovered crash images: extent count of every file,
    kept for the latest crash point (the final state once the walk is done;
    parallel crash-check threads may call it in any order)."""

    def __init__(self) -> None:
        self.point = -1
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, mnt: str, cs: CrashState) -> list[Finding]:
        if cs.point > self.point:
            counts = extent_counts(mnt)
            with self._lock:
                if cs.point > self.point:
                    self.point, self.counts = cs.point, counts
        return []


def extent_counts(mnt: str) -> dict[str, int]:
    out = {}
    for root, _, files in os.walk(mnt):
        for name in files:
            path = os.path.join(root, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                buf = bytearray(_FIEMAP.pack(0, (1 << 64) - 1, 0, 0, 0, 0))
                fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
                out[os.path.relpath(path, mnt)] = _FIEMAP.unpack(bytes(buf))[3]
            except OSError:
                continue
            finally:
                os.close(fd)
    return out


def features(trial: Trial, extents: Extents) -> Counter[tuple[object, ...]]:
    h = trial.result.checks.oracle.h if trial.result.checks.oracle else None
    f: Counter[tuple[object, ...]] = Counter()
    if h is None:
        return f
    program = sorted(h.execs, key=lambda e: (e.rec.thread, e.op.seq, e.rec.iter))
    prev = "start"
    for ex in program:
        f["op", prev, ex.kind, 0 if ex.ok else ex.rec.errno] += 1
        prev = ex.kind
    ops = trial.plan.by_seq()
    for seq, flushes in flushes_per_op(trial.result.log_path).items():
        f["flushes", ops[seq][1].kind, min(flushes, 2)] += 1
    for ino in h.inodes.values():
        if ino.kind == "file":
            f["size", bucket(ino.size >> 12)] += 1
    for path, n in extents.counts.items():
        f["extents", path, bucket(n)] += 1
    by_point: dict[int, set[str]] = {}
    for finding in trial.findings:
        if finding.crash_point is not None:
            by_point.setdefault(finding.crash_point, set()).add(finding.kind)
    persisted = sorted((ex.mark, ex.kind) for ex in h.execs if ex.mark is not None and ex.kind in PERSIST)
    outcomes = set()
    for point in trial.result.points:
        before = [k for m, k in persisted if m <= point]
        outcomes.add(("point", before[-1] if before else "none", ",".join(sorted(by_point.get(point, {"ok"})))))
    f.update(outcomes)  # present or not: how many crash points there are follows the log's timing
    for path, hits in (run_hits(trial.result.report) or {}).items():
        for fn, n in hits.items():
            f["kernel", path, fn] += n
    return f


def flushes_per_op(log_path: str) -> dict[int, int]:
    """Op seq -> flushes logged between the previous op's completion mark and its own."""
    out: dict[int, int] = {}
    n = 0
    with LogReader(log_path) as reader:
        for e in reader.entries():
            if e.is_flush:
                n += 1
            elif e.is_mark and e.mark is not None:
                m = parse_mark(e.mark)
                if m is not None and m.seq is not None:
                    out[m.seq] = out.get(m.seq, 0) + n
                n = 0
    return out


class SharedMap:
    """AFL's coverage map, attached from __AFL_SHM_ID (absent: a run outside AFL, nothing to write)."""

    def __init__(self) -> None:
        self.size = int(os.environ.get("AFL_MAP_SIZE", DEFAULT_MAP_SIZE))
        self.buf: ctypes.Array[ctypes.c_ubyte] | None = None
        shm_id = os.environ.get("__AFL_SHM_ID")
        if shm_id is None:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        addr = libc.shmat(int(shm_id), None, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "shmat of AFL's map failed")
        self.buf = (ctypes.c_ubyte * self.size).from_address(addr)

    def index(self, feature: Iterable[object]) -> int:
        return zlib.crc32(repr(tuple(feature)).encode()) % self.size

    def add(self, feats: Counter[tuple[object, ...]]) -> None:
        if self.buf is None:
            return
        for feat, count in feats.items():
            i = self.index(feat)
            self.buf[i] = min(255, self.buf[i] + count)

    def touch(self) -> None:
        """AFL++ requires at least one map byte set by every run."""
        self.add(Counter({("run",): 1}))
