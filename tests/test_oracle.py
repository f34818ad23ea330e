"""The content oracle on small fixtures: a real pc-exec run on a scratch
directory gives real records and marks; the "crash image" is that directory,
then altered by the test the way a broken file system would leave it."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
from pathlib import Path


from checkers.history import build_history
from checkers.oracle import ContentOracle
from common import require_exec, run_exec
from workloads.format import parse_workload
from workloads.pattern import generate
from workloads.plan import build_plan, render_plan
from workloads.results import read_records

pytestmark = require_exec


def doc(ops: list[dict]) -> dict:
    return {"format": "powercut-workload/1", "name": "oracle-test", "threads": [{"name": "main", "ops": ops}]}


class Run:
    """One executor run: the oracle, and the mark index of each op's completion."""

    def __init__(self, tmp: Path, ops: list[dict], tamper=None) -> None:
        self.workload = parse_workload(doc(ops))
        self.plan = build_plan(self.workload)
        self.dir = tmp / "fs"
        self.dir.mkdir()
        (tmp / "plan").write_text(render_plan(self.plan))
        run_exec(tmp / "plan", self.dir, "--out", str(tmp / "records"), "--mark-file", str(tmp / "marks"))
        results = read_records(tmp / "records", self.plan)
        if tamper:
            results = dataclasses.replace(results, records=tuple(tamper(r) for r in results.records))
        # A regular file as mark file: one line per mark; its line number stands in for the log index.
        self.marks = list(enumerate((tmp / "marks").read_text().splitlines()))
        self.history = build_history(self.plan, results, self.marks)
        self.oracle = ContentOracle(self.history, self.plan.wid, "ext4")

    def after(self, seq: int) -> int:
        """The crash point right after op SEQ completed."""
        return next(i for i, t in self.marks if t.startswith(f"op 0.{seq}."))

    def before(self, seq: int) -> int:
        return self.after(seq) - 1

    def check(self, point: int) -> list:
        return self.oracle.inspect(str(self.dir), point)


FSYNCED = [
    {"op": "mkdir", "path": "A"},
    {"op": "open", "path": "A/foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "f"},  # 1
    {"op": "pwrite", "fd": "f", "offset": 0, "length": 16384},                   # 2
    {"op": "fsync", "fd": "f"},                                                  # 3
    {"op": "pwrite", "fd": "f", "offset": 16384, "length": 4096},                # 4
    {"op": "close", "fd": "f"},                                                  # 5
]


def test_the_real_final_state_passes(tmp_path: Path) -> None:
    ops = FSYNCED + [
        {"op": "open", "path": "A/bar", "flags": ["O_CREAT", "O_RDWR", "O_SYNC"], "fd": "g"},
        {"op": "write", "fd": "g", "length": 5000},
        {"op": "fallocate", "fd": "g", "mode": ["PUNCH_HOLE", "KEEP_SIZE"], "offset": 0, "length": 4096},
        {"op": "ftruncate", "fd": "g", "length": 3000},
        {"op": "setxattr", "path": "A/bar", "name": "user.a", "length": 100},
        {"op": "fsync", "fd": "g"},
        {"op": "close", "fd": "g"},
        {"op": "link", "from": "A/bar", "to": "A/baz"},
        {"op": "symlink", "target": "foo", "path": "A/ln"},
        {"op": "rename", "from": "A/foo", "to": "A/moved"},
        {"op": "sync"},
        {"op": "unlink", "path": "A/nothing"},
    ]
    run = Run(tmp_path, ops)
    assert run.history.disagreements == []
    last = run.marks[-1][0]
    assert run.check(last) == []
    # Early crash points judge the same final image differently: paths whose
    # creating op had not started cannot exist yet, and the fsynced A/foo
    # (renamed later) must still be there.
    early = {f.evidence["path"]: f for f in run.check(run.before(6))}
    assert set(early) == {"A/baz", "A/ln", "A/moved", "A/foo"}
    assert "before any op created it" in early["A/baz"].detail
    assert (early["A/foo"].kind, early["A/foo"].evidence["found"]) == ("durability", "missing")


def test_fsynced_file_missing_is_a_durability_finding(tmp_path: Path) -> None:
    run = Run(tmp_path, FSYNCED)
    os.unlink(run.dir / "A/foo")
    assert run.check(run.before(3)) == []  # before fsync returned: the file may be lost
    found = run.check(run.after(3))
    assert [(f.kind, f.evidence["rule"], f.evidence["path"]) for f in found] == [("durability", "fsync-new-name", "A/foo")]
    assert found[0].evidence["found"] == "missing" and "fsync" in found[0].evidence["op"]


def test_fsynced_data_lost_is_a_durability_finding(tmp_path: Path) -> None:
    run = Run(tmp_path, FSYNCED)
    os.truncate(run.dir / "A/foo", 16384)  # op 4 not started yet at the first check
    with open(run.dir / "A/foo", "r+b") as f:
        f.seek(8192)
        f.write(bytes(512))
    assert run.check(run.before(3)) == []
    found = run.check(run.after(3))
    assert len(found) == 1 and found[0].kind == "durability" and found[0].evidence["rule"] == "fsync-data"
    assert found[0].evidence["offset"] == 8192 and found[0].evidence["found"] == "zeros"


def test_unsynced_tail_may_be_lost_but_fsynced_size_may_not_shrink(tmp_path: Path) -> None:
    run = Run(tmp_path, FSYNCED)
    os.truncate(run.dir / "A/foo", 16384)  # the unsynced write of op 4 lost: legal
    assert run.check(run.marks[-1][0]) == []
    os.truncate(run.dir / "A/foo", 12288)  # part of the fsynced data lost: not
    found = run.check(run.marks[-1][0])
    assert [f.kind for f in found] == ["durability"] and "size 12288" in found[0].evidence["found"]


def test_foreign_data_is_stale_data(tmp_path: Path) -> None:
    ops = FSYNCED + [{"op": "open", "path": "B", "flags": ["O_CREAT", "O_RDWR"], "fd": "b"},
                     {"op": "pwrite", "fd": "b", "offset": 0, "length": 4096},
                     {"op": "close", "fd": "b"}]
    run = Run(tmp_path, ops)
    foreign = (run.dir / "B").read_bytes()[:512]  # B's chunk, planted in A/foo's unsynced tail
    with open(run.dir / "A/foo", "r+b") as f:
        f.seek(16384)
        f.write(foreign)
    found = run.check(run.marks[-1][0])
    assert [f.kind for f in found] == ["stale-data"]
    assert found[0].evidence["offset"] == 16384 and "op 7" in found[0].evidence["found"]
    # Garbage without a chunk header is stale too.
    with open(run.dir / "A/foo", "r+b") as f:
        f.seek(16384)
        f.write(b"\xab" * 512)
    assert [f.kind for f in run.check(run.marks[-1][0])] == ["stale-data"]


def test_rename_losing_the_file_is_an_atomicity_finding(tmp_path: Path) -> None:
    run = Run(tmp_path, FSYNCED + [{"op": "rename", "from": "A/foo", "to": "A/bar"}])
    point = run.after(6)
    assert run.check(point) == []
    shutil.move(run.dir / "A/bar", run.dir / "A/foo")  # the old state: fine
    assert run.check(point) == []
    os.unlink(run.dir / "A/foo")  # neither: the rename lost the file
    found = run.check(point)
    assert [(f.kind, f.evidence["rule"]) for f in found] == [("atomicity", "rename-atomic")]


def test_rename_over_a_durable_file_never_leaves_it_missing(tmp_path: Path) -> None:
    ops = FSYNCED + [{"op": "open", "path": "A/new", "flags": ["O_CREAT", "O_RDWR"], "fd": "n"},
                     {"op": "pwrite", "fd": "n", "offset": 0, "length": 4096},
                     {"op": "sync"},
                     {"op": "rename", "from": "A/new", "to": "A/foo"},
                     {"op": "close", "fd": "n"}]
    run = Run(tmp_path, ops)
    point = run.after(9)
    os.unlink(run.dir / "A/foo")
    kinds = {(f.kind, f.evidence["path"]) for f in run.check(point)}
    assert ("atomicity", "A/foo") in kinds


def test_unlink_made_durable_by_sync_must_stay(tmp_path: Path) -> None:
    ops = FSYNCED + [{"op": "link", "from": "A/foo", "to": "keep"},
                     {"op": "unlink", "path": "A/foo"}, {"op": "sync"}]
    run = Run(tmp_path, ops)
    os.link(run.dir / "keep", run.dir / "A/foo")  # the old file back under its old name
    assert run.check(run.before(8)) == []  # the unlink may be lost before sync returned
    found = {(f.kind, f.evidence["rule"], f.evidence["path"]) for f in run.check(run.after(8))}
    # The resurrected name, and the link count of the file it names (2, but sync made it 1).
    assert found == {("durability", "no-resurrection", "A/foo"), ("durability", "sync-all", "keep")}


def test_durable_xattr_missing(tmp_path: Path) -> None:
    ops = FSYNCED + [{"op": "setxattr", "path": "A/foo", "name": "user.a", "length": 64}, {"op": "sync"}]
    run = Run(tmp_path, ops)
    os.removexattr(run.dir / "A/foo", "user.a")
    assert run.check(run.before(7)) == []
    found = run.check(run.after(7))
    assert [f.kind for f in found] == ["durability"] and "xattr user.a" in found[0].detail


def test_setxattr_with_a_count_sets_each_name_and_sync_makes_each_durable(tmp_path: Path) -> None:
    ops = FSYNCED + [{"op": "setxattr", "path": "A/foo", "name": "user.m", "length": 64, "count": 3},
                     {"op": "sync"}]
    run = Run(tmp_path, ops)
    names = ["user.m", "user.m.1", "user.m.2"]
    assert sorted(n for n in os.listxattr(run.dir / "A/foo") if n.startswith("user.")) == names
    want = generate(run.plan.wid, 1, 6, 0, 0, 64)  # file id 1 (A/foo), op 6, iteration 0
    assert {os.getxattr(run.dir / "A/foo", n) for n in names} == {want}
    assert run.check(run.after(7)) == []
    os.removexattr(run.dir / "A/foo", "user.m.2")   # the last of the three lost after sync
    assert run.check(run.before(7)) == []
    found = run.check(run.after(7))
    assert [f.kind for f in found] == ["durability"] and "xattr user.m.2" in found[0].detail


def test_setxattr_with_a_count_that_fails_promises_only_the_names_it_set(tmp_path: Path) -> None:
    """ext4 answers ENOSPC once the inode and its xattr block are full: the executor
    stops there and records how many it set (aux); the model promises exactly those."""
    ops = FSYNCED + [{"op": "setxattr", "path": "A/foo", "name": "user.m", "length": 64, "count": 3},
                     {"op": "sync"}]

    def tamper(r):  # as if the third setxattr had failed with ENOSPC
        return dataclasses.replace(r, ret=-1, errno=errno.ENOSPC, aux=2) if r.kind == "setxattr" else r
    run = Run(tmp_path, ops, tamper)
    os.removexattr(run.dir / "A/foo", "user.m.2")   # never promised: no finding
    assert run.check(run.after(7)) == []
    os.removexattr(run.dir / "A/foo", "user.m.1")   # promised by the sync
    found = run.check(run.after(7))
    assert [f.kind for f in found] == ["durability"] and "xattr user.m.1" in found[0].detail


def test_osync_write_is_durable_only_in_its_range(tmp_path: Path) -> None:
    ops = [{"op": "open", "path": "f", "flags": ["O_CREAT", "O_RDWR"], "fd": "a"},
           {"op": "pwrite", "fd": "a", "offset": 0, "length": 4096},
           {"op": "sync"},
           {"op": "pwrite", "fd": "a", "offset": 0, "length": 4096},   # 3: not synced
           {"op": "open", "path": "f", "flags": ["O_RDWR", "O_DSYNC"], "fd": "s"},
           {"op": "pwrite", "fd": "s", "offset": 8192, "length": 4096},  # 5: O_DSYNC
           {"op": "close", "fd": "s"},
           {"op": "close", "fd": "a"}]
    run = Run(tmp_path, ops)
    wid = run.plan.wid
    fid = run.plan.by_seq()[1][1].fields["file"]
    with open(run.dir / "f", "r+b") as f:  # op 3 lost, op 1's data back: legal
        f.write(generate(wid, fid, 1, 0, 0, 4096))
    assert run.check(run.marks[-1][0]) == []
    with open(run.dir / "f", "r+b") as f:  # the O_DSYNC range lost: not
        f.seek(8192)
        f.write(bytes(4096))
    found = run.check(run.after(5))
    assert [(f.kind, f.evidence["rule"]) for f in found] == [("durability", "osync-write")]


def test_kernel_disagreeing_with_the_model_is_a_semantics_finding(tmp_path: Path) -> None:
    ops = [{"op": "unlink", "path": "nothing"}, {"op": "mkdir", "path": "A"}]

    def tamper(r):  # as if unlink of a missing file had succeeded
        return dataclasses.replace(r, ret=0, errno=0) if r.kind == "unlink" else r

    assert Run(tmp_path / "a", ops).history.disagreements == [] if (tmp_path / "a").mkdir() is None else False
    (tmp_path / "b").mkdir()
    run = Run(tmp_path / "b", ops, tamper)
    assert [d.expected for d in run.history.disagreements] == ["expected ENOENT, the kernel returned success"]


def test_paths_through_symlinks_are_followed(tmp_path: Path) -> None:
    ops = [{"op": "mkdir", "path": "A"},
           {"op": "symlink", "target": "A", "path": "L"},
           {"op": "open", "path": "L/foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "f"},
           {"op": "pwrite", "fd": "f", "offset": 0, "length": 4096},
           {"op": "fsync", "fd": "f"},
           {"op": "close", "fd": "f"}]
    run = Run(tmp_path, ops)
    assert "A/foo" in run.history.ns[-1] and not run.history.lost
    assert run.check(run.marks[-1][0]) == []
    with open(run.dir / "A/foo", "r+b") as f:
        f.write(bytes(512))
    assert [f.kind for f in run.check(run.marks[-1][0])] == ["durability"]


def test_o_creat_o_excl_does_not_follow_a_dangling_symlink(tmp_path: Path) -> None:
    """open(2): with O_CREAT | O_EXCL a symlink is not followed: EEXIST, nothing created
    (a semantics false positive a btrfs campaign found); without O_EXCL the open
    follows the dangling link and creates its target."""
    ops = [{"op": "symlink", "target": "missing", "path": "bar"},
           {"op": "open", "path": "bar", "flags": ["O_CREAT", "O_EXCL", "O_RDWR"], "fd": "f"},
           {"op": "open", "path": "bar", "flags": ["O_CREAT", "O_RDWR"], "fd": "g"},
           {"op": "close", "fd": "g"}]
    run = Run(tmp_path, ops)
    opens = [r for r in run.history.execs if r.kind == "open"]
    assert [(x.rec.ret < 0, x.rec.errno) for x in opens] == [(True, errno.EEXIST), (False, 0)]
    assert run.history.disagreements == [] and "missing" in run.history.ns[-1]
    assert run.check(run.marks[-1][0]) == []


def test_report_evidence_is_json(tmp_path: Path) -> None:
    run = Run(tmp_path, FSYNCED)
    os.unlink(run.dir / "A/foo")
    found = run.check(run.after(3))
    assert found, "an fsynced file that is gone must be a finding"
    for f in found:
        doc = f.to_json()
        assert json.loads(json.dumps(doc)) == doc              # survives the round trip unchanged
        # the evidence as a JSON object a reader can query: which file, which rule, which op
        assert doc["kind"] == "durability" and doc["crash_point"] == run.after(3), doc
        assert doc["evidence"]["path"] == "A/foo" and doc["evidence"]["rule"] == "fsync-new-name", doc
        assert (doc["evidence"]["expected"], doc["evidence"]["found"]) == ("present", "missing"), doc


def test_a_failed_write_may_leave_its_bytes(tmp_path: Path) -> None:
    """write(2) promises nothing about the file after an error, and Linux's O_DIRECT
    write with a misaligned length writes its aligned first blocks before it returns
    EINVAL: a failed write's bytes are allowed in its range, never required. EBADF
    (fd not open for writing) is the exception: nothing was written."""
    ops = [
        {"op": "open", "path": "foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "f"},  # 0
        {"op": "pwrite", "fd": "f", "offset": 0, "length": 4096},                  # 1
        {"op": "fsync", "fd": "f"},                                                # 2
        {"op": "pwrite", "fd": "f", "offset": 0, "length": 5000},                  # 3: "fails", its bytes are there
        {"op": "fdatasync", "fd": "f"},                                            # 4
        {"op": "close", "fd": "f"},                                                # 5
    ]

    def failed(err: int):
        return lambda r: dataclasses.replace(r, ret=-1, errno=err) if r.seq == 3 else r

    for name, err, kinds in (("einval", errno.EINVAL, []), ("ebadf", errno.EBADF, ["stale-data"])):
        (tmp_path / name).mkdir()
        run = Run(tmp_path / name, ops, tamper=failed(err))
        found = run.check(run.after(5))
        assert [f.kind for f in found] == kinds, found
        # before the failed write started, its bytes are foreign all the same
        assert [f.kind for f in run.check(run.after(1))] == ["stale-data"]


def test_names_under_a_path_the_model_lost_are_not_predicted(tmp_path: Path) -> None:
    """mmap_write past EOF faults (SIGBUS): the model loses bar, so it does not
    apply link(bar, A) either; A is a file in the kernel, and A/C fails with
    ENOTDIR, not the ENOENT the stale namespace would predict (found by a btrfs
    fuzz campaign under linux, 6.18). Paths elsewhere are still predicted."""
    ops = [{"op": "open", "path": "bar", "flags": ["O_CREAT", "O_RDWR"], "fd": "f"},
           {"op": "mmap_write", "fd": "f", "offset": 0, "length": 4096, "msync": False},
           {"op": "link", "from": "bar", "to": "A"},
           {"op": "open", "path": "A/C", "flags": ["O_RDONLY"], "fd": "g"},
           {"op": "open", "path": "B/C", "flags": ["O_RDONLY"], "fd": "h"}]
    run = Run(tmp_path, ops)
    assert {"bar", "A", "A/C"} <= run.history.uncertain and run.history.disagreements == []

    def lie(r):  # the kernel says B/C exists: still a disagreement
        return dataclasses.replace(r, ret=7, errno=0) if r.seq == 4 else r
    shutil.rmtree(tmp_path / "fs")
    (tmp_path / "lie").mkdir()
    lied = Run(tmp_path / "lie", ops, tamper=lie)
    assert [d.ex.op.fields["path"] for d in lied.history.disagreements] == ["B/C"]


def test_fsync_of_a_file_does_not_carry_its_parent_directorys_rename(tmp_path: Path) -> None:
    """rename(A, B) moves A/foo to B/foo, but that is no name change of foo's own: an fsync
    of foo need not make it durable (docs/semantics.md, deliberately not required), so A/foo
    still there after the crash is no finding. The ordered ACE space found this false
    positive on a healthy ext4 (mkdir A; creat A/foo; sync; open A/foo; rename A B; fsync)."""
    ops = [{"op": "mkdir", "path": "A"},
           {"op": "open", "path": "A/foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "s"},
           {"op": "close", "fd": "s"},
           {"op": "sync"},
           {"op": "open", "path": "A/foo", "flags": ["O_RDWR"], "fd": "f"},
           {"op": "rename", "from": "A", "to": "B"},
           {"op": "fsync", "fd": "f"},
           {"op": "close", "fd": "f"}]
    run = Run(tmp_path, ops)
    os.rename(run.dir / "B", run.dir / "A")   # the crash kept the state before the rename
    assert run.check(run.after(6)) == []
