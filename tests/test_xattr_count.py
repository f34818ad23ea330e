"""setxattr with a count (a file with hundreds of xattrs) through the whole stack.

`powercut run` on the fuse backend: 400 xattrs of 1 KiB on one file, fsync,
the file closed and unlinked, then the ACE tail of writes and fsyncs of another
file. xfs takes all 400 (a node-format attr tree); ext4 without ea_inode fills
the inode and its one xattr block and answers ENOSPC: the executor stops there
and records how many it set, the model promises exactly those, and every crash
state is clean on the host kernel. With flushes dropped (the planted fault) the
xattrs the fsync made durable are found missing, by name."""

from __future__ import annotations

import errno as E
import json
from pathlib import Path

import pytest

from checkers.history import build_history
from conftest import PcEnv, needs_root_stack
from harness.reports.export.ops import repro_args, xfs_io_script
from workloads import ace
from workloads.plan import parse_plan
from workloads.results import read_records

pytestmark = [pytest.mark.e2e, needs_root_stack]

COUNT = 400


def _workload(pc: PcEnv) -> Path:
    ops = [{"op": "open", "path": "foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "a"},
           {"op": "pwrite", "fd": "a", "offset": 0, "length": 4096}, {"op": "sync"},
           {"op": "setxattr", "path": "foo", "name": "user.many", "length": 1024, "count": COUNT},
           {"op": "fsync", "fd": "a"}, {"op": "close", "fd": "a"},
           {"op": "link", "from": "foo", "to": "keep"},    # checked after the crash by this name
           {"op": "unlink", "path": "foo"}, {"op": "sync"}, *ace._tail()]
    wl = pc.tmp / "many.json"
    wl.write_text(json.dumps({"format": "powercut-workload/1", "name": "many-xattrs",
                              "threads": [{"name": "main", "ops": ops}]}))
    return wl


def _run(pc: PcEnv, wl: Path, fs: str, *args: str, rc: int) -> tuple[Path, dict]:
    out = pc.tmp / f"run-{fs}-{len(args)}"
    p = pc.run("run", str(wl), "--fs", fs, "--backend", "fuse", "--out", str(out), *args)
    assert p.returncode == rc, p.stdout + p.stderr
    return out, json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("fs", ["xfs", "ext4"])
def test_many_xattrs_are_set_modelled_and_checked(pc: PcEnv, fs: str) -> None:
    wl = _workload(pc)
    out, report = _run(pc, wl, fs, rc=0)
    assert report["findings"] == [] and report["crash_states_checked"] > 0
    plan = parse_plan((out / "plan.txt").read_text())
    results = read_records(out / "records.bin", plan)
    rec = next(r for r in results.records if r.kind == "setxattr")
    if fs == "xfs":
        assert (rec.ret, rec.aux) == (0, COUNT)
    else:  # the inode and one 4 KiB block hold a few 1 KiB values, then ENOSPC
        assert rec.ret == -1 and rec.errno == E.ENOSPC and 0 < rec.aux < COUNT
    h = build_history(plan, results, [])
    assert h.disagreements == []
    promised = h.inodes[h.ns[-1]["keep"]].xattrs_at(len(h.execs))
    assert len([n for n in promised if n.startswith("user.many")]) == rec.aux
    # The planted fault: flushes dropped, the fsync's xattrs are missing after it returned.
    _, report = _run(pc, wl, fs, "--fault", "drop-flush", "--reorder", "drop-one", rc=1)
    lost = [f for f in report["findings"] if f["kind"] == "durability" and "xattr user.many" in f["detail"]]
    assert lost, [f["detail"] for f in report["findings"]][:5]


def test_the_exports_set_each_name() -> None:
    args = repro_args([{"op": "setxattr", "path": "f", "name": "user.m", "length": 8, "count": 3},
                       {"op": "setxattr", "path": "f", "name": "user.n", "length": 8}])
    assert args[:10] == ["setxattrs", "f", "user.m", "8", "3", "setxattr", "f", "user.n", "8", "mark"]
    shell = xfs_io_script([{"op": "setxattr", "path": "f", "name": "user.m", "length": 8, "count": 3}]).lines
    assert "-n user.m " in shell[0] and "$(seq 1 2)" in shell[1] and "-n user.m.$i " in shell[1]
