"""XFS_IOC_EXCHANGE_RANGE (ioctl_xfs_exchange_range(2)) through the whole stack.

Each case of tests/workloads/xfs_exchange_range_cases.json runs through
`powercut run` on the fuse backend on xfs made with `-i exchange=1` (with
bookworm's xfsprogs the feature bit is set by xfs_db and hidden from its
xfs_repair: foundation/xfs_exchange.py; every crash state is fsck'd): the
kernel's answer is the one written here (what decides it:
fs/xfs/xfs_exchrange.c xfs_exchange_range, xfs_exchange_range_checks), the
model predicts each (no `semantics` finding; told the file system cannot
exchange, it disagrees on every exchange that got past the fd checks), and
every crash state is clean. An exchange followed by fsyncs, or with DSYNC, is
durable: with flushes dropped (the planted fault) the exchanged bytes are found
missing, by fsync-data and by exchange-range-dsync.

The cases avoid XFS_EXCHANGE_RANGE_TO_EOF with two different offsets: kernels
without "xfs: fix exchange-range-to-eof file size exchange" (this host's 6.18.44
among them) set the wrong sizes there (bench/validation/xfs-exchange-range-to-eof.json).
"""

from __future__ import annotations

import errno as E
import json
from pathlib import Path

import pytest

from checkers.history import build_history
from conftest import WORKLOADS, PcEnv, needs_root_stack
from workloads.plan import parse_plan
from workloads.results import read_records

pytestmark = [pytest.mark.e2e, needs_root_stack]

CASES = WORKLOADS / "xfs_exchange_range_cases.json"
EXCHANGE = "-i exchange=1"
# id -> errno (0: success) on xfs with the exchange-range feature.
WANT: dict[str, int] = {
    "xchg-readonly": E.EBADF,            # both files must be open for reading and writing
    "xchg-append": E.EBADF,              # ... and neither O_APPEND
    "xchg-dir": E.EISDIR,
    "xchg-dir-before-ebadf": E.EISDIR,   # the directory check comes before the access modes
    "xchg-unaligned-offset": E.EINVAL,   # offsets aligned to the allocation unit (the block)
    "xchg-past-eof": E.EINVAL,           # without TO_EOF both ranges end within EOF
    "xchg-start-past-eof": E.EINVAL,     # no range starts past its file's end
    "xchg-unaligned-length": E.EINVAL,   # an unaligned length only where both ranges end at EOF
    "xchg-overlap": E.EINVAL,            # ranges of one file may not overlap
    "xchg-partial-eof-into-middle": E.EINVAL,
    "xchg-range": 0,
    "xchg-same-file": 0,
    "xchg-to-eof": 0,
    "xchg-to-eof-same-offsets": 0,       # TO_EOF and DSYNC
    "xchg-partial-eofs": 0,              # both ranges end at an unaligned EOF
    "xchg-nothing": 0,                   # length 0: nothing, success
}
FD_CHECKS = ("xchg-readonly", "xchg-append", "xchg-dir", "xchg-dir-before-ebadf")


def run(pc: PcEnv, wl: Path, fs: str, *args: str, rc: int, name: str = "run") -> tuple[Path, dict]:
    out = pc.tmp / name
    p = pc.run("run", str(wl), "--fs", fs, "--backend", "fuse", "--out", str(out), *args)
    assert p.returncode == rc, p.stdout + p.stderr
    return out, json.loads((out / "report.json").read_text())


def answers(out: Path) -> tuple[dict[str, int], object, object]:
    plan = parse_plan((out / "plan.txt").read_text())
    results = read_records(out / "records.bin", plan)
    ids = {op.seq: op.id for _, op in plan.ops() if op.id}
    got = {ids[r.seq]: (0 if r.ret >= 0 else r.errno) for r in results.records if r.seq in ids}
    return got, plan, results


def test_each_exchange_answer_is_the_kernels_and_the_models(pc: PcEnv) -> None:
    out, report = run(pc, CASES, "xfs", "--mkfs-opts", EXCHANGE, rc=0)
    assert report["crash_states_checked"] > 0 and report["findings"] == []
    got, plan, results = answers(out)
    assert {k: E.errorcode.get(v, v) for k, v in got.items()} == {k: E.errorcode.get(v, v) for k, v in WANT.items()}
    assert build_history(plan, results, [], exchange=True).disagreements == []
    # The model does predict each exchange: told the file system has no exchange-range, it
    # expects EOPNOTSUPP (or ENOTTY) from every one that got past the fd checks.
    wrong = build_history(plan, results, [], exchange=False).disagreements
    assert sorted(d.ex.op.id for d in wrong) == sorted(k for k in WANT if k not in FD_CHECKS)


@pytest.mark.parametrize("fs,mkfs,refused", [("xfs", "", E.EOPNOTSUPP), ("ext4", "", E.ENOTTY)])
def test_without_the_feature_the_exchange_is_refused_and_predicted(pc: PcEnv, fs: str, mkfs: str,
                                                                  refused: int) -> None:
    """xfs made without -i exchange=1 refuses it (after the fd checks); ext4 has no such ioctl."""
    out, report = run(pc, CASES, fs, rc=0)
    assert report["findings"] == []
    got, _, _ = answers(out)
    assert {k for k, v in got.items() if v == refused} == {k for k in WANT if k not in FD_CHECKS or fs == "ext4"}


def _exchange_then_persist(pc: PcEnv, flags: list[str]) -> Path:
    persist = [] if "DSYNC" in flags else [{"op": "fsync", "fd": "a"}, {"op": "fsync", "fd": "b"}]
    ops = [{"op": "open", "path": "foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "a"},
           {"op": "pwrite", "fd": "a", "offset": 0, "length": 65536},
           {"op": "open", "path": "bar", "flags": ["O_CREAT", "O_RDWR"], "fd": "b"},
           {"op": "pwrite", "fd": "b", "offset": 0, "length": 65536},
           {"op": "sync"},
           {"op": "exchange_range", "from_fd": "a", "fd": "b", "flags": flags}, *persist,
           {"op": "close", "fd": "a"}, {"op": "close", "fd": "b"}]
    wl = pc.tmp / f"xchg-{'-'.join(flags)}.json"
    wl.write_text(json.dumps({"format": "powercut-workload/1", "name": "exchange",
                              "threads": [{"name": "main", "ops": ops}]}))
    return wl


@pytest.mark.parametrize("flags,rule", [(["TO_EOF"], "fsync-data"), (["TO_EOF", "DSYNC"], "exchange-range-dsync")])
def test_a_persisted_exchange_is_durable_and_checked(pc: PcEnv, flags: list[str], rule: str) -> None:
    """Clean on the host kernel; with flushes dropped, bar's new contents (foo's former
    64 KiB) are missing after the fsync or DSYNC that made them durable. (bar has 64 KiB too:
    where bar is shorter, a DSYNC exchange moves foo's blocks past bar's end into its hole in
    later transactions, which no kernel tried forces to disk before the call returns:
    tests/workloads/xfs_exchange_dsync_hole.json, docs/bugs/README.md.)"""
    wl = _exchange_then_persist(pc, flags)
    _, report = run(pc, wl, "xfs", "--mkfs-opts", EXCHANGE, rc=0, name="clean")
    assert report["findings"] == [] and report["crash_states_checked"] > 0
    _, report = run(pc, wl, "xfs", "--mkfs-opts", EXCHANGE, "--fault", "drop-flush", "--reorder", "drop-one",
                    rc=1, name="faulty")
    lost = [f for f in report["findings"] if f["kind"] == "durability" and f["evidence"].get("rule") == rule
            and f["detail"].startswith("bar")]
    assert lost, [(f["detail"], f["evidence"].get("rule")) for f in report["findings"]][:5]
