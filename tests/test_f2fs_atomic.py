"""f2fs atomic writes (the op f2fs_atomic): the format and plan, the executor's ioctls, the
batch model on tampered fixtures (a real pc-exec run whose "crash image" the test alters, the
records told the ioctls succeeded as on f2fs), and the generators' vocabulary. The real stack
on f2fs (a guest kernel): tests/test_vm_f2fs.py."""

from __future__ import annotations

import dataclasses
import errno
import random
from pathlib import Path

import pytest

from checkers.fsrules import Semantics
from checkers.history import build_history
from checkers.oracle import ContentOracle
from common import require_exec, run_exec
from foundation.errors import UsageError
from workloads.format import parse_workload
from workloads.opcodec import decode
from workloads.pattern import generate
from workloads.plan import build_plan, parse_plan, render_plan
from workloads.results import OpRecord, read_records


def doc(ops: list[dict]) -> dict:
    return {"format": "powercut-workload/1", "name": "f2fs-atomic-test", "threads": [{"name": "main", "ops": ops}]}


OPEN = {"op": "open", "path": "db", "flags": ["O_CREAT", "O_RDWR"], "fd": "f"}


def atomic(action: str) -> dict:
    return {"op": "f2fs_atomic", "fd": "f", "action": action}


def test_f2fs_atomic_survives_the_plan_round_trip() -> None:
    plan = build_plan(parse_workload(doc([OPEN, atomic("start"), atomic("replace"), atomic("commit"),
                                          atomic("abort"), {"op": "close", "fd": "f"}])))
    text = render_plan(plan)
    for i, name in enumerate(["start", "replace", "commit", "abort"], start=1):
        assert f"op seq={i} kind=f2fs_atomic fd=0 flags={name}" in text
    assert parse_plan(text) == plan


@pytest.mark.parametrize("op", [{"op": "f2fs_atomic", "fd": "f", "action": "begin"},
                                {"op": "f2fs_atomic", "fd": "f"}])
def test_bad_f2fs_atomic_fields_are_one_line_errors(op: dict) -> None:
    with pytest.raises(UsageError) as e:
        parse_workload(doc([OPEN, op, {"op": "close", "fd": "f"}]))
    assert str(e.value).startswith("WORKLOAD: threads[0].ops[1]") and "\n" not in str(e.value)


# The batch: 12 KiB written and fsynced (op 1), then START (3), two writes (4: 0..4K, 5: 8K..16K,
# growing the file), COMMIT (6).
OLD = 12288
BATCH = [OPEN, {"op": "pwrite", "fd": "f", "offset": 0, "length": OLD}, {"op": "fsync", "fd": "f"},  # 0 1 2
         atomic("start"), {"op": "pwrite", "fd": "f", "offset": 0, "length": 4096},                  # 3 4
         {"op": "pwrite", "fd": "f", "offset": 8192, "length": 8192}, atomic("commit"),              # 5 6
         {"op": "close", "fd": "f"}]                                                                 # 7


class Run:
    """A pc-exec run on a scratch directory (no f2fs: the ioctls fail with ENOTTY, the writes
    land as plain writes), its f2fs_atomic records made successes, and the f2fs oracle."""

    def __init__(self, tmp: Path, ops: list[dict]) -> None:
        self.plan = build_plan(parse_workload(doc(ops)))
        self.dir = tmp / "fs"
        self.dir.mkdir()
        (tmp / "plan").write_text(render_plan(self.plan))
        run_exec(tmp / "plan", self.dir, "--out", str(tmp / "records"), "--mark-file", str(tmp / "marks"))
        results = read_records(tmp / "records", self.plan)
        self.ioctls = [r for r in results.records if r.kind == "f2fs_atomic"]
        results = dataclasses.replace(results, records=tuple(self.as_f2fs(r) for r in results.records))
        self.marks = list(enumerate((tmp / "marks").read_text().splitlines()))
        history = build_history(self.plan, results, self.marks)
        self.oracle = ContentOracle(history, self.plan.wid, "f2fs", semantics=Semantics(fs="f2fs"))

    @staticmethod
    def as_f2fs(r: OpRecord) -> OpRecord:
        return dataclasses.replace(r, ret=0, errno=0) if r.kind == "f2fs_atomic" else r

    def after(self, seq: int) -> int:
        return next(i for i, t in self.marks if t.startswith(f"op 0.{seq}."))

    def check(self, point: int) -> list:
        return self.oracle.inspect(str(self.dir), point)

    def image(self, new: set[int]) -> None:
        """The file as a crash could leave it: of the batch's writes (by seq), those in NEW
        applied to the fsynced 12 KiB, the others not; the size is 16 KiB with op 5, else 12 KiB."""
        data = bytearray(generate(self.plan.wid, 1, 1, 0, 0, OLD))
        if 4 in new:
            data[0:4096] = generate(self.plan.wid, 1, 4, 0, 0, 4096)
        if 5 in new:
            data[8192:] = generate(self.plan.wid, 1, 5, 0, 8192, 8192)
        (self.dir / "db").write_bytes(bytes(data))


needs_exec = require_exec


@needs_exec
def test_the_executor_issues_the_ioctls(tmp_path: Path) -> None:
    run = Run(tmp_path, BATCH)
    # a scratch directory is no f2fs: each ioctl reached its file system and was refused
    assert [(r.ret, r.errno) for r in run.ioctls] == [(-1, errno.ENOTTY)] * 2


@needs_exec
@pytest.mark.parametrize("new", [set(), {4, 5}])
def test_a_committed_batch_all_or_none_passes(tmp_path: Path, new: set[int]) -> None:
    run = Run(tmp_path, BATCH)
    run.image(new)
    # COMMIT neither waits nor flushes: after it returned, either outcome is allowed
    assert run.check(run.after(6)) == [] and run.check(run.after(7)) == []


@needs_exec
@pytest.mark.parametrize("new", [{4}, {5}])
def test_half_a_committed_batch_is_an_atomicity_finding(tmp_path: Path, new: set[int]) -> None:
    run = Run(tmp_path, BATCH)
    run.image(new)
    for point in (run.after(6) - 1, run.after(6), run.after(7)):  # commit in flight, returned, later
        found = run.check(point)
        assert [f.kind for f in found] == ["atomicity"], found
        ev = found[0].evidence
        assert ev["rule"] == "f2fs-atomic-write" and "f2fs_atomic" in ev["op"]
        half = (0, 4096) if 4 in new else (8192, 16384)
        assert [tuple(r) for r in ev["new_ranges"]] == [half], ev


@needs_exec
def test_half_a_batch_is_no_finding_where_f2fs_is_not(tmp_path: Path) -> None:
    """The rule names f2fs: the same image judged as ext4 (where the ioctls never succeed)
    does not report the batch."""
    run = Run(tmp_path, BATCH)
    run.oracle = ContentOracle(run.oracle.h, run.plan.wid, "ext4", semantics=Semantics(fs="ext4"))
    run.image({4})
    assert "f2fs-atomic-write" not in {f.evidence.get("rule") for f in run.check(run.after(6))}


@needs_exec
def test_a_batch_is_not_in_the_file_before_its_commit(tmp_path: Path) -> None:
    """Up to the end of op 5 (the batch's last write) the COMMIT cannot have begun: its data
    there is data never written to the file (the crash point after op 5 may be during the commit)."""
    run = Run(tmp_path, BATCH)
    run.image(set())
    assert run.check(run.after(4)) == []
    run.image({4, 5})
    for seq in (3, 4):
        assert [f.kind for f in run.check(run.after(seq))] == ["stale-data"]


@needs_exec
@pytest.mark.parametrize("end", [atomic("abort"), {"op": "close", "fd": "f"}])
def test_an_aborted_batch_is_never_in_the_file(tmp_path: Path, end: dict) -> None:
    """ABORT, and the last close of a writable fd (f2fs_release_file), drop the batch; the
    COMMIT after an ABORT is an fdatasync of the file (no batch: f2fs_do_sync_file)."""
    ops = [*BATCH[:6], end, *([] if end["op"] == "close" else [atomic("commit"), {"op": "close", "fd": "f"}])]
    run = Run(tmp_path, ops)
    run.image(set())
    assert run.check(run.after(len(ops) - 1)) == []
    run.image({4, 5})
    assert run.check(run.after(len(ops) - 1)) != []


def test_only_f2fs_campaigns_draw_atomic_batches() -> None:
    rng = random.Random(37)
    inputs = [rng.randbytes(64 * 12) for _ in range(200)]
    on_f2fs = [decode(d, True, False, Semantics(fs="f2fs").f2fs_atomic()) for d in inputs]
    batches = [o for ops in on_f2fs for o in ops if o["op"] == "f2fs_atomic"]
    assert {o["action"] for o in batches} == {"start", "replace", "commit", "abort"}
    for fs in ("ext4", "xfs", "btrfs"):
        sem = Semantics(fs=fs)
        assert not any(o["op"] == "f2fs_atomic" for d in inputs for o in decode(d, sem.reflink(), sem.exchange(),
                                                                                sem.f2fs_atomic()))
    for ops in on_f2fs:  # every batch: START/REPLACE, pwrites on its fd, COMMIT/ABORT, nothing else between
        parse_workload(doc(ops))
        i = 0
        while i < len(ops):
            if ops[i]["op"] == "f2fs_atomic":
                assert ops[i]["action"] in ("start", "replace")
                j = i + 1
                while ops[j]["op"] == "pwrite":
                    assert ops[j]["fd"] == ops[i]["fd"]
                    j += 1
                assert ops[j]["op"] == "f2fs_atomic" and ops[j]["action"] in ("commit", "abort")
                assert ops[j]["fd"] == ops[i]["fd"] and j > i + 1
                i = j
            i += 1


@needs_exec
def test_appends_in_a_batch_land_after_each_other(tmp_path: Path) -> None:
    """With O_APPEND, a batch's second write appends after its first (the size in memory),
    not after the size on disk: the file with the whole batch committed is no finding."""
    ops = [{"op": "open", "path": "db", "flags": ["O_CREAT", "O_RDWR", "O_APPEND"], "fd": "f"},
           {"op": "pwrite", "fd": "f", "offset": 0, "length": 4096}, {"op": "sync"}, atomic("start"),
           {"op": "pwrite", "fd": "f", "offset": 0, "length": 4096},
           {"op": "pwrite", "fd": "f", "offset": 0, "length": 4096}, atomic("commit"), {"op": "sync"},
           {"op": "close", "fd": "f"}]
    run = Run(tmp_path, ops)  # on the scratch directory the writes appended one after another
    assert (run.dir / "db").stat().st_size == 3 * 4096
    assert run.check(run.after(7)) == []
