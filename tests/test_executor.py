"""pc-exec on a plain directory: return values, data, marks, timing, latency."""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkers.latency import findings, summarize
from workloads import pattern
from workloads.format import OP_KINDS, Budget, Workload, parse_workload
from workloads.marks import Mark, format_mark, parse_mark
from workloads.plan import build_plan, compile_plan, file_ids
from workloads.results import FLAG_SIGBUS, FLAG_SKIPPED, OpRecord, Results, read_records
from common import EXEC, require_exec, require_root

# `make test` builds pc-exec; the tests never build into the source tree themselves.
pytestmark = require_exec


def doc(*threads: dict[str, Any], name: str = "exec-test") -> dict[str, Any]:
    return {"format": "powercut-workload/1", "name": name, "threads": list(threads)}


@dataclass
class Run:
    workload: Workload
    results: Results
    marks: list[str]
    clock: tuple[int, int]   # the test's CLOCK_MONOTONIC before and after the process
    dir: Path

    def by_id(self, op_id: str) -> list[OpRecord]:
        return [r for r in self.results.records if r.op_id == op_id]

    def one(self, op_id: str) -> OpRecord:
        (r,) = self.by_id(op_id)
        return r

    def data(self, op_id: str, path: str, offset: int, length: int, it: int = 0) -> bytes:
        """What op OP_ID (iteration IT) should have written there."""
        return pattern.generate(self.workload.wid, file_ids(self.workload)[path], self.one_seq(op_id), it, offset, length)

    def one_seq(self, op_id: str) -> int:
        return next(op.seq for _, op in build_plan(self.workload).ops() if op.id == op_id)


def run(tmp_path: Path, d: dict[str, Any], prefix: str = "") -> Run:
    w = parse_workload(d)
    (tmp_path / "plan").write_text(compile_plan(w))
    (tmp_path / "dir").mkdir()
    cmd = [str(EXEC), "--plan", str(tmp_path / "plan"), "--dir", str(tmp_path / "dir"),
           "--out", str(tmp_path / "records"), "--mark-file", str(tmp_path / "marks"), "--mark-prefix", prefix]
    t0 = time.monotonic_ns()
    p = subprocess.run(cmd, capture_output=True, text=True)
    t1 = time.monotonic_ns()
    assert p.returncode == 0, p.stderr
    marks = (tmp_path / "marks").read_text().splitlines(keepends=True)
    return Run(w, read_records(tmp_path / "records", w), marks, (t0, t1), tmp_path / "dir")


def c_pattern(v: tuple[int, ...]) -> bytes:
    """The executor's pattern bytes for (wid, file_id, seq, iter, offset, length)."""
    return subprocess.run([str(EXEC), "--pattern-dump", *map(str, v)], capture_output=True, check=True).stdout


def test_pattern_c_equals_python() -> None:
    vectors = [(0, 0, 0, 0, 0, 512), (1, 2, 3, 4, 100, 2000), (5, 6, 7, 8, 511, 2),
               (0xDEADBEEF, 1, 17, 7999, 131072000, 16384),
               (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 2**40 + 7, 1500)]
    for v in vectors:
        assert c_pattern(v) == pattern.generate(*v), v


@settings(max_examples=20, deadline=None)
@given(st.tuples(*[st.integers(0, 2**32 - 1)] * 4, st.integers(0, 2**50), st.integers(0, 5000)))
def test_pattern_c_equals_python_anywhere(v: tuple[int, ...]) -> None:
    assert c_pattern(v) == pattern.generate(*v)


def op(kind: str, op_id: str, **fields: Any) -> dict[str, Any]:
    return {"op": kind, "id": op_id, **fields}


FD = "fd"  # expected: any descriptor number
MAIN_OPS = [  # (op, expected ret or FD, expected errno)
    (op("mkdir", "mkdir", path="d"), 0, 0),
    (op("open", "open-f", path="d/f", flags=["O_CREAT", "O_RDWR"], fd="f"), FD, 0),
    (op("fallocate", "falloc", fd="f", mode=[], offset=0, length=65536), 0, 0),
    (op("write", "write-f", fd="f", length=4096), 4096, 0),
    (op("pwrite", "pwrite-f", fd="f", offset=8292, length=1000), 1000, 0),
    (op("pread", "pread-f", fd="f", offset=0, length=4096), 4096, 0),
    (op("read", "read-f", fd="f", length=100), 100, 0),
    (op("mmap_write", "mmap-f", fd="f", offset=12388, length=5000, msync=True), 0, 0),
    (op("mmap_write", "mmap-eof", fd="f", offset=1 << 20, length=100), -1, errno.EFAULT),
    ({"op": "repeat", "id": "rep", "count": 4, "ops": [
        op("pwrite", "pwrite-rep", fd="f", offset=20480, stride=1024, length=512)]}, 0, 0),
    (op("ftruncate", "ftrunc", fd="f", length=32768), 0, 0),
    (op("fsync", "fsync", fd="f"), 0, 0),
    (op("fsetxattr", "fxattr-f", fd="f", name="user.fx", length=16, flags=["CREATE"]), 0, 0),
    (op("fsetxattr", "fxattr-there", fd="f", name="user.fx", length=16, flags=["CREATE"]), -1, errno.EEXIST),
    (op("fsetxattr", "fxattr-absent", fd="f", name="user.fy", length=16, flags=["REPLACE"]), -1, errno.ENODATA),
    (op("open", "open-c", path="d/c", flags=["O_CREAT", "O_RDWR"], fd="c"), FD, 0),
    (op("copy_file_range", "copy-fc", from_fd="f", from_offset=4096, fd="c", offset=100, length=5000), 5000, 0),
    (op("open", "open-dir", path="d", flags=["O_RDONLY"], fd="dir"), FD, 0),
    (op("clone", "clone-from-dir", from_fd="dir", fd="c"), -1, errno.EISDIR),  # on every file system
    # XFS_IOC_EXCHANGE_RANGE is xfs's: other file systems (this test's directory) know no such ioctl
    (op("exchange_range", "exchange-fc", from_fd="f", fd="c", flags=["TO_EOF"]), -1, errno.ENOTTY),
    (op("f2fs_atomic", "f2fs-start", fd="f", action="start"), -1, errno.ENOTTY),  # no f2fs here
    (op("close", "close-dir", fd="dir"), 0, 0),
    (op("close", "close-c", fd="c"), 0, 0),
    (op("fiemap", "fiemap-f", fd="f", sync=True), 1, 0),  # one fallocated extent, written or not
    (op("pwritev2", "pwritev2-f", fd="f", iov=[512, 512], offset=24576, flags=["RWF_DSYNC"]), 1024, 0),
    (op("statx", "statx-f", path="d/f"), 0, 0),
    (op("fdatasync", "fdatasync", fd="f"), 0, 0),
    (op("syncfs", "syncfs", fd="f"), 0, 0),
    (op("sync_file_range", "sfr", fd="f", offset=0, length=0, flags=["WRITE"]), 0, 0),
    (op("sync", "sync"), 0, 0),
    (op("close", "close-f", fd="f"), 0, 0),
    (op("creat", "creat-g", path="d/g", fd="g"), FD, 0),
    (op("close", "close-g", fd="g"), 0, 0),
    (op("truncate", "trunc-g", path="d/g", length=1000), 0, 0),
    (op("setxattr", "xattr-g", path="d/g", name="user.pc", length=64), 0, 0),
    (op("setxattr", "xattr-f", path="d/f", name="user.gone", length=8), 0, 0),
    (op("removexattr", "rmxattr", path="d/f", name="user.gone"), 0, 0),
    (op("removexattr", "rmxattr-again", path="d/f", name="user.gone"), -1, errno.ENODATA),
    (op("link", "link", **{"from": "d/g", "to": "d/h"}), 0, 0),
    (op("open", "open-tmp", path="d", flags=["O_TMPFILE", "O_RDWR"], fd="t"), FD, 0),
    (op("linkat", "linkat-tmp", fd="t", to="d/t"), 0, 0),
    (op("linkat", "linkat-taken", fd="t", to="d/g"), -1, errno.EEXIST),
    (op("close", "close-t", fd="t"), 0, 0),
    (op("symlink", "symlink", target="g", path="d/s"), 0, 0),
    (op("rename", "rename", **{"from": "d/h", "to": "d/i"}), 0, 0),
    (op("rename", "rename-noreplace", **{"from": "d/i", "to": "d/g"}, flags=["NOREPLACE"]), -1, errno.EEXIST),
    (op("unlink", "unlink", path="d/i"), 0, 0),
    (op("unlink", "unlink-missing", path="d/missing"), -1, errno.ENOENT),
    (op("mkdir", "mkdir-e", path="e"), 0, 0),
    (op("rmdir", "rmdir-e", path="e"), 0, 0),
    (op("rmdir", "rmdir-full", path="d"), -1, errno.ENOTEMPTY),
    (op("open", "open-missing", path="absent", flags=["O_RDONLY"], fd="n"), -1, errno.ENOENT),
    (op("fsync", "fsync-missing", fd="n"), -1, errno.EBADF),
    (op("close", "close-missing", fd="n"), -1, errno.EBADF),
    (op("open", "open-direct", path="d/o", flags=["O_CREAT", "O_WRONLY", "O_DIRECT"], fd="o"), FD, 0),
    (op("pwrite", "direct", fd="o", offset=4096, length=8192), 8192, 0),
    (op("pwrite", "direct-unaligned", fd="o", offset=100, length=512), -1, errno.EINVAL),
    (op("close", "close-o", fd="o"), 0, 0),
    (op("open", "open-a", path="d/a", flags=["O_CREAT", "O_WRONLY", "O_APPEND"], fd="a"), FD, 0),
    (op("write", "append-1", fd="a", length=1000), 1000, 0),
    (op("write", "append-2", fd="a", length=1000), 1000, 0),
    (op("close", "close-a", fd="a"), 0, 0),
    (op("sleep", "nap", us=1000), 0, 0),
    (op("barrier", "meet", name="b"), 0, 0),
]


@pytest.fixture(scope="module")
def every_op(tmp_path_factory: pytest.TempPathFactory) -> Run:
    d = doc({"name": "main", "ops": [o for o, _, _ in MAIN_OPS]},
            {"name": "other", "ops": [op("barrier", "meet-other", name="b")]})
    return run(tmp_path_factory.mktemp("every"), d, prefix="T1:")


def test_every_op_kind_returns_what_the_kernel_says(every_op: Run) -> None:
    assert {r.kind for r in every_op.results.records} == set(OP_KINDS)
    for o, ret, err in MAIN_OPS:
        for r in every_op.by_id(o["id"]):
            assert (r.errno, r.ret >= 0 if ret == FD else r.ret) == (err, True if ret == FD else ret), o
    assert every_op.one("fsync-missing").flags & FLAG_SKIPPED and every_op.one("close-missing").skipped
    assert every_op.one("mmap-eof").flags & FLAG_SIGBUS
    assert not every_op.one("rmdir-full").skipped


def test_files_hold_the_pattern_where_written(every_op: Run) -> None:
    r, d = every_op, every_op.dir
    f = (d / "d/f").read_bytes()
    assert len(f) == 32768
    assert f[0:4096] == r.data("write-f", "d/f", 0, 4096)
    assert f[8292:9292] == r.data("pwrite-f", "d/f", 8292, 1000)
    assert f[12388:17388] == r.data("mmap-f", "d/f", 12388, 5000)
    reps = r.by_id("pwrite-rep")
    assert [(x.iter, x.offset) for x in reps] == [(k, 20480 + 1024 * k) for k in range(4)]
    for k in range(4):
        off = 20480 + 1024 * k
        assert f[off:off + 512] == r.data("pwrite-rep", "d/f", off, 512, it=k)
    assert f[4096:8192] == bytes(4096)  # fallocated, never written
    assert f[24576:25600] == r.data("pwritev2-f", "d/f", 24576, 1024)  # two iovecs, one range
    assert pattern.decode_chunk(f[512:1024]) == pattern.ChunkInfo(r.workload.wid, 1, r.one_seq("write-f"), 0, 512)
    assert r.one("read-f").offset == 4096
    o = (d / "d/o").read_bytes()
    assert o[4096:12288] == r.data("direct", "d/o", 4096, 8192)
    a = (d / "d/a").read_bytes()
    assert [r.one("append-1").offset, r.one("append-2").offset] == [0, 1000]
    assert a == r.data("append-1", "d/a", 0, 1000) + r.data("append-2", "d/a", 1000, 1000)
    assert os.getxattr(d / "d/g", "user.pc") == r.data("xattr-g", "d/g", 0, 64)
    assert os.getxattr(d / "d/f", "user.fx") == r.data("fxattr-f", "d/f", 0, 16)  # the fd's file's pattern
    assert os.readlink(d / "d/s") == "g" and (d / "d/g").stat().st_size == 1000


def test_marks_follow_every_op(every_op: Run) -> None:
    marks = every_op.marks
    assert marks[0] == "T1:start\n" and marks[-1] == "T1:end\n"
    assert all(len(m.encode()) <= 479 for m in marks)
    parsed = [parse_mark(m, "T1:") for m in marks[1:-1]]
    ops = [r for r in every_op.results.records if r.kind != "repeat"]
    assert len(parsed) == len(ops)
    for t in (0, 1):  # per thread, in the order the ops ran
        assert [m for m in parsed if m and m.thread == t] == [Mark("op", t, r.seq, r.iter) for r in ops if r.thread == t]
    assert format_mark(parsed[0], "T1:") == marks[1]


def test_timing_agrees_with_an_independent_clock(tmp_path: Path) -> None:
    period_us, count = 20000, 10
    d = doc({"name": "t", "ops": [
        op("sleep", "nap", us=20000),
        op("open", "o", path="f", flags=["O_CREAT", "O_RDWR"], fd="f"),
        {"op": "repeat", "id": "tick", "count": count, "period_us": period_us, "ops": [
            op("pwrite", "w", fd="f", offset=0, length=512, stride=512)]},
    ]})
    r = run(tmp_path, d)
    # Order and counts only (no durations: the machine is shared and noisy). The executor's
    # clock is CLOCK_MONOTONIC, the test's time.monotonic_ns() the same clock read independently.
    ticks = r.by_id("tick")
    assert [t.iter for t in ticks] == list(range(count))
    due = [t.start_ns - t.late_ns for t in ticks]  # exact: start - lateness = due time
    assert [x - due[0] for x in due] == [k * period_us * 1000 for k in range(count)]
    assert all(t.late_ns >= 0 for t in ticks)      # no iteration starts before it is due
    period_ns = period_us * 1000
    # the executor's miss flag follows its definition: started a period late or ran past the next due time
    assert [t.deadline_miss for t in ticks] == [
        t.late_ns > period_ns or t.end_ns > d + period_ns for t, d in zip(ticks, due)]
    # every timestamp in program order, nested in the test's own readings of the same clock
    nap, opened = r.one("nap"), r.one("o")
    stamps = [r.clock[0], r.results.start_ns, nap.start_ns, nap.end_ns, opened.start_ns, opened.end_ns]
    for t in ticks:
        stamps += [t.start_ns, t.end_ns]
    stamps += [r.results.end_ns, r.clock[1]]
    assert stamps == sorted(stamps), stamps
    assert 0 < r.results.overhead_min_ns <= r.results.overhead_median_ns
    between = summarize(r.results, r.workload)["between_ops"]  # the executor's own time between ops
    assert between["count"] == 1 + count  # nap -> open, and each iteration's start -> its pwrite
    assert 0 < between["p50_us"] <= between["p99_us"] <= between["max_us"]
    rep = summarize(r.results, r.workload)["repeats"]["tick"]
    assert (rep["thread"], rep["period_us"], rep["iterations"]) == ("t", period_us, count)
    assert rep["deadline_misses"] == sum(t.deadline_miss for t in ticks)
    assert rep["max_late_us"] == max(t.late_ns for t in ticks) / 1000


def test_budgets_turn_into_latency_findings(every_op: Run) -> None:
    w = every_op.workload
    tight = dataclasses.replace(w, budgets={"write": Budget(max_us=0), "fsync": Budget(p99_us=0)})
    s = summarize(every_op.results, tight)
    assert s["kinds"]["write"]["count"] == 2 + 1 and s["kinds"]["write"]["budget_violations"] == 3
    assert s["kinds"]["fsync"]["skipped"] == 1 and s["kinds"]["fsync"]["count"] == 1
    assert s["threads"]["main"]["write"]["count"] == 3 and "write" not in s["threads"]["other"]
    assert s["overhead_ns"]["median"] == every_op.results.overhead_median_ns
    found = findings(s, tight)
    assert [(f["kind"], f["op"], f["budget"], f["limit_us"]) for f in found] == [
        ("latency", "fsync", "p99_us", 0), ("latency", "write", "max_us", 0)]
    assert found[1]["measured_us"] == s["kinds"]["write"]["max_us"] > 0
    loose = dataclasses.replace(w, budgets={"write": Budget(max_us=1e9, p99_us=1e9)})
    s = summarize(every_op.results, loose)
    assert findings(s, loose) == [] and s["kinds"]["write"]["budget_violations"] == 0
    stats = s["kinds"]["pwrite"]
    assert stats["p50_us"] <= stats["p99_us"] <= stats["p999_us"] <= stats["max_us"]
    assert stats["errors"] == 1  # the unaligned O_DIRECT pwrite


def test_two_threads_meet_at_a_barrier_and_flush_with_sync_file_range(tmp_path: Path) -> None:
    ncpu = os.cpu_count() or 1
    d = doc(
        {"name": "writer", "sched": {"policy": "rr", "priority": 1, "cpu": 0}, "ops": [
            op("creat", "creat", path="rec", fd="f"),
            op("pwrite", "fill", fd="f", offset=0, length=1 << 20),
            op("barrier", "written-w", name="written"),
            op("barrier", "synced-w", name="synced"),
            op("close", "close-w", fd="f"),
        ]},
        {"name": "flusher", "sched": {"policy": "batch", "nice": 5, "cpu": ncpu - 1}, "ops": [
            op("barrier", "written-f", name="written"),
            op("open", "open-f", path="rec", flags=["O_RDWR"], fd="f"),
            op("sync_file_range", "sfr", fd="f", offset=0, length=0, flags=["WAIT_BEFORE", "WRITE", "WAIT_AFTER"]),
            op("close", "close-f", fd="f"),
            op("barrier", "synced-f", name="synced"),
        ]})
    r = run(tmp_path, d)
    assert all(x.errno == 0 for x in r.results.records)
    assert r.one("sfr").thread == 1 and r.one("sfr").offset == 0
    assert r.one("sfr").start_ns >= r.one("fill").end_ns
    assert r.one("synced-w").end_ns >= r.one("sfr").end_ns
    assert (r.dir / "rec").read_bytes() == r.data("fill", "rec", 0, 1 << 20)
    assert r.results.thread_names == ("writer", "flusher")


@pytest.mark.skipif(not shutil.which("filefrag"), reason="needs filefrag (e2fsprogs)")
def test_fiemap_counts_extents_as_filefrag_does(tmp_path: Path) -> None:
    """Sparse, fallocated and interleaved files: the fiemap op's count is filefrag's."""
    writes = [op("pwrite", f"w{i}", fd="s", offset=i << 20, length=4096) for i in range(5)]
    inter = {"op": "repeat", "count": 32, "ops": [
        op("pwrite", "ia", fd="a", offset=0, length=8192, stride=8192), op("fsync", "fa", fd="a"),
        op("pwrite", "ib", fd="b", offset=0, length=8192, stride=8192), op("fsync", "fb", fd="b")]}
    d = doc({"name": "t", "ops": [
        op("open", "os", path="sparse", flags=["O_CREAT", "O_RDWR"], fd="s"), *writes,
        op("fiemap", "fs", fd="s", sync=True),
        op("open", "oa", path="a", flags=["O_CREAT", "O_RDWR"], fd="a"),
        op("open", "ob", path="b", flags=["O_CREAT", "O_RDWR"], fd="b"),
        op("fallocate", "pre", fd="b", mode=["KEEP_SIZE"], offset=1 << 20, length=1 << 20),
        inter, op("fiemap", "fa-n", fd="a", sync=True), op("fiemap", "fb-n", fd="b"),
        op("close", "cs", fd="s"), op("close", "ca", fd="a"), op("close", "cb", fd="b")]})
    r = run(tmp_path, d)
    for op_id, name in [("fs", "sparse"), ("fa-n", "a"), ("fb-n", "b")]:
        out = subprocess.run(["filefrag", str(r.dir / name)], capture_output=True, text=True, check=True).stdout
        expected = int(out.rsplit(":", 1)[1].split()[0])
        assert (r.one(op_id).errno, r.one(op_id).ret) == (0, expected), (name, out)
    assert r.one("fb-n").ret >= 2  # data blocks and the fallocated range are apart


def stderr_lines(p: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln for ln in p.stderr.splitlines() if "warning:" not in ln]


PLAN_HEAD = "powercut-plan 1\nworkload wid=1 name=x\n"
THREAD = "thread index=0 name=t policy={policy} priority={prio} nice=0 cpu={cpu} fds=1\n"


@pytest.mark.parametrize("plan,message", [
    ("garbage\n", "not a powercut plan"),
    (PLAN_HEAD + THREAD.format(policy="other", prio=0, cpu=-1) + "op seq=0 kind=sync fd=0\nendthread\nend\n",
     "line 4: field 'fd' does not belong to a sync op"),
    (PLAN_HEAD + THREAD.format(policy="other", prio=0, cpu=-1) + "op seq=0 kind=fsync fd=3\nendthread\nend\n",
     "line 4: fd=3: not a number in [0, 0]"),
    (PLAN_HEAD + THREAD.format(policy="other", prio=0, cpu=-1) + "op seq=0 kind=repeat count=2 period_us=0\n",
     "ends early: 'endrepeat' expected"),
    (PLAN_HEAD + THREAD.format(policy="other", prio=0, cpu=1000) + "op seq=0 kind=sync\nendthread\nend\n",
     "thread t: cannot pin to CPU 1000"),
])
def test_bad_plan_exits_2_with_one_line(tmp_path: Path, plan: str, message: str) -> None:
    (tmp_path / "plan").write_text(plan)
    p = subprocess.run([str(EXEC), "--plan", str(tmp_path / "plan"), "--dir", str(tmp_path), "--out",
                        str(tmp_path / "rec")], capture_output=True, text=True)
    assert p.returncode == 2
    (line,) = stderr_lines(p)
    assert line.startswith("pc-exec: ") and message in line, line


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    for args in ([], ["--plan", "p"], ["--bogus"], ["--plan", "p", "--dir", ".", "--out", "o", "--mark-prefix", "x" * 401]):
        p = subprocess.run([str(EXEC), *args], capture_output=True, text=True)
        assert p.returncode == 2 and len(stderr_lines(p)) == 1, args


@require_root
def test_unpermitted_realtime_policy_is_a_clear_error() -> None:
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o777)
        plan = Path(d) / "plan"
        plan.write_text(PLAN_HEAD + THREAD.format(policy="fifo", prio=10, cpu=-1) + "op seq=0 kind=sync\nendthread\nend\n")
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                            str(EXEC), "--plan", str(plan), "--dir", d, "--out", f"{d}/rec"],
                           capture_output=True, text=True)
    assert p.returncode == 2
    assert stderr_lines(p) == ["pc-exec: thread t: cannot set scheduling policy fifo priority 10: Operation not permitted"]
