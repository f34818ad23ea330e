"""fsetxattr with XATTR_CREATE / XATTR_REPLACE through the whole stack.

The op added in the six files of "Adding an op" (docs/architecture.md): `powercut
run` on the fuse backend sets an xattr through an fd with each flag, where the
flag lets it and where it refuses (EEXIST, ENODATA: setxattr(2)), then fsyncs.
The kernel's answers are the model's (no disagreement), the value the model
promises is the last one set, every crash state is clean on the host kernel,
and with flushes dropped (the planted fault) the fsynced xattr is found
missing or old, by name. The exports say the same op."""

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

OPS = [{"op": "open", "path": "foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "a"},
       {"op": "pwrite", "fd": "a", "offset": 0, "length": 4096}, {"op": "sync"},
       {"op": "fsetxattr", "fd": "a", "name": "user.x", "length": 8, "flags": ["CREATE"]},     # absent: set
       {"op": "fsetxattr", "fd": "a", "name": "user.x", "length": 100, "flags": ["CREATE"]},   # EEXIST
       {"op": "fsetxattr", "fd": "a", "name": "user.y", "length": 8, "flags": ["REPLACE"]},    # ENODATA
       {"op": "fsetxattr", "fd": "a", "name": "user.x", "length": 100, "flags": ["REPLACE"]},  # present: set
       {"op": "fsync", "fd": "a"}, {"op": "close", "fd": "a"}, *ace._tail()]
ANSWERS = [0, E.EEXIST, E.ENODATA, 0]


def _run(pc: PcEnv, fs: str, *args: str, rc: int) -> tuple[Path, dict]:
    wl = pc.tmp / "fsetxattr.json"
    wl.write_text(json.dumps({"format": "powercut-workload/1", "name": "fsetxattr-flags",
                              "threads": [{"name": "main", "ops": OPS}]}))
    out = pc.tmp / f"run-{fs}-{len(args)}"
    p = pc.run("run", str(wl), "--fs", fs, "--backend", "fuse", "--out", str(out), *args)
    assert p.returncode == rc, p.stdout + p.stderr
    return out, json.loads((out / "report.json").read_text())


@pytest.mark.e2e
@needs_root_stack
@pytest.mark.parametrize("fs", ["ext4", "xfs"])
def test_fsetxattr_flags_are_run_modelled_and_checked(pc: PcEnv, fs: str) -> None:
    out, report = _run(pc, fs, rc=0)
    assert report["findings"] == [] and report["crash_states_checked"] > 0
    plan = parse_plan((out / "plan.txt").read_text())
    results = read_records(out / "records.bin", plan)
    recs = [r for r in results.records if r.kind == "fsetxattr"]
    assert [0 if r.ret == 0 else r.errno for r in recs] == ANSWERS
    h = build_history(plan, results, [])
    assert h.disagreements == []
    last = next(op.seq for _, op in plan.ops() if op.kind == "fsetxattr" and op.fields["flags"] == ("REPLACE",)
                and op.fields["name"] == "user.x")
    promised = h.inodes[h.ns[-1]["foo"]].xattrs_at(len(h.execs))
    assert set(promised) == {"user.x"} and promised["user.x"][1:] == (last, 0, 100)
    # The planted fault: flushes dropped, the xattr the fsync made durable is not there.
    _, report = _run(pc, fs, "--fault", "drop-flush", "--reorder", "drop-one", rc=1)
    lost = [f for f in report["findings"] if f["kind"] == "durability" and "xattr user.x" in f["detail"]]
    assert lost, [f["detail"] for f in report["findings"]][:5]


def test_the_exports_keep_the_flags() -> None:
    ops = OPS[:2] + OPS[3:7]
    args = repro_args(ops)
    i = args.index("fsetxattr")
    assert args[i:i + 5] == ["fsetxattr", "a", "user.x", "8", "1"]   # XATTR_CREATE
    assert args.count("fsetxattr") == 4 and "2" in args[args.index("user.y"):][:3]  # XATTR_REPLACE
    shell = [ln for ln in xfs_io_script(ops).lines if "user." in ln]
    # CREATE runs setfattr only where getfattr finds no such name; REPLACE only where it does
    assert " || $SETFATTR_PROG -n user.x " in shell[0] and " && $SETFATTR_PROG -n user.y " in shell[2]
    assert all("/proc/self/fd/" in ln for ln in shell)
