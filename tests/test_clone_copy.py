"""copy_file_range(2) and reflink clones (ioctl_ficlone(2)) through the whole stack.

Each case of tests/workloads/clone_copy.json (one error at a time, several at once,
the copies and clones that work) runs through `powercut run` on the fuse backend
on ext4, xfs and btrfs: the kernel's answer is the one written here (what decides
it: fs/read_write.c generic_file_rw_checks and generic_copy_file_checks,
fs/remap_range.c do_clone_file_range, generic_remap_checks,
generic_remap_check_len), the model predicts each (no `semantics` finding, and
a model told the wrong file system disagrees), and every crash state of the
run is clean. A clone or copy followed by an fsync of the destination is then
durable: with flushes dropped (the planted fault) the copied bytes are found
missing, by the fsync-data rule (xfstests generic/501, btrfs/098: clone, fsync,
power failure, the destination's data must be there)."""

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

CASES = WORKLOADS / "clone_copy.json"
# id -> errno (0: success) where the file system clones (xfs, btrfs).
REFLINK: dict[str, int] = {
    "copy-into-readonly": E.EBADF,        # generic_file_rw_checks: the destination needs FMODE_WRITE
    "copy-from-writeonly": E.EBADF,       # ... the source FMODE_READ
    "copy-into-append": E.EBADF,          # ... and an O_APPEND destination is refused
    "copy-from-dir": E.EISDIR,
    "copy-dir-before-ebadf": E.EISDIR,    # the directory check comes before the access modes
    "copy-overlap": E.EINVAL,             # generic_copy_file_checks: overlapping ranges of one file
    "copy": 0,
    "copy-unaligned": 0,                  # copies need no alignment
    "copy-past-end": 0,                   # shortened to the source's end: 0 bytes
    "clone-into-readonly": E.EBADF,
    "clone-from-dir": E.EISDIR,
    "clone-whole": 0,                     # FICLONE
    "clone-unaligned": E.EINVAL,          # generic_remap_checks: block-aligned offsets
    "clone-past-end": E.EINVAL,           # would be shortened, and FICLONERANGE may not shorten
    "clone-offset-at-end": E.EINVAL,      # pos_in >= size_in
    "clone-overlap": E.EINVAL,
    "clone-range": 0,
    "clone-partial-eof-into-middle": E.EINVAL,  # generic_remap_check_len: a partial block inside the destination
    "clone-partial-eof": 0,               # a partial last block at or past the destination's end
}
# ext4 has no remap_file_range: every clone that passes the fd checks is EOPNOTSUPP.
NO_REFLINK = {k: (E.EOPNOTSUPP if k.startswith("clone") and v not in (E.EBADF, E.EISDIR) else v)
              for k, v in REFLINK.items()}


def run(pc: PcEnv, wl: Path, fs: str, *args: str, rc: int) -> tuple[Path, dict]:
    out = pc.tmp / f"run-{fs}"
    p = pc.run("run", str(wl), "--fs", fs, "--backend", "fuse", "--out", str(out), *args)
    assert p.returncode == rc, p.stdout + p.stderr
    return out, json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("fs", ["ext4", "xfs", "btrfs"])
def test_each_copy_and_clone_answer_is_the_kernels_and_the_models(pc: PcEnv, fs: str) -> None:
    out, report = run(pc, CASES, fs, rc=0)
    assert report["crash_states_checked"] > 0 and report["findings"] == []
    plan = parse_plan((out / "plan.txt").read_text())
    results = read_records(out / "records.bin", plan)
    ids = {op.seq: op.id for _, op in plan.ops() if op.id}
    got = {ids[r.seq]: (0 if r.ret >= 0 else r.errno) for r in results.records if r.seq in ids}
    want = NO_REFLINK if fs == "ext4" else REFLINK
    assert {k: E.errorcode.get(v, v) for k, v in got.items()} == {k: E.errorcode.get(v, v) for k, v in want.items()}
    assert build_history(plan, results, [], reflink=fs != "ext4").disagreements == []
    # The model does predict each clone: told the other kind of file system, it disagrees.
    wrong = build_history(plan, results, [], reflink=fs == "ext4").disagreements
    assert sorted(d.ex.op.id for d in wrong) == sorted(k for k in REFLINK if REFLINK[k] != NO_REFLINK[k])


def _clone_then_fsync(pc: PcEnv, kind: str) -> Path:
    extra = {"op": "clone", "from_fd": "a", "fd": "b"} if kind == "clone" else \
        {"op": "copy_file_range", "from_fd": "a", "from_offset": 0, "fd": "b", "offset": 4096, "length": 16384}
    ops = [{"op": "open", "path": "foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "a"},
           {"op": "pwrite", "fd": "a", "offset": 0, "length": 65536},
           {"op": "open", "path": "bar", "flags": ["O_CREAT", "O_RDWR"], "fd": "b"},
           {"op": "fsync", "fd": "b"}, extra, {"op": "fsync", "fd": "b"},
           {"op": "close", "fd": "a"}, {"op": "close", "fd": "b"}]
    wl = pc.tmp / f"{kind}.json"
    wl.write_text(json.dumps({"format": "powercut-workload/1", "name": kind,
                              "threads": [{"name": "main", "ops": ops}]}))
    return wl


@pytest.mark.parametrize("fs,kind", [("xfs", "clone"), ("btrfs", "clone"), ("btrfs", "copy_file_range"),
                                     ("ext4", "copy_file_range")])
def test_an_fsynced_clone_or_copy_is_durable_and_checked(pc: PcEnv, fs: str, kind: str) -> None:
    """Clean on the host kernel; with flushes dropped, the destination's copied bytes
    are missing after the fsync that made them durable (a durability finding on bar)."""
    wl = _clone_then_fsync(pc, kind)
    _, report = run(pc, wl, fs, rc=0)
    assert report["findings"] == [] and report["crash_states_checked"] > 0
    (pc.tmp / f"run-{fs}").rename(pc.tmp / "clean")
    _, report = run(pc, wl, fs, "--fault", "drop-flush", "--reorder", "drop-one", rc=1)
    lost = [f for f in report["findings"] if f["kind"] == "durability" and f["evidence"].get("rule") == "fsync-data"
            and f["detail"].startswith("bar")]
    assert lost, [f["detail"] for f in report["findings"]][:5]


@pytest.mark.parametrize("fs", ["ext4", "btrfs"])
def test_a_copy_through_an_o_direct_fd_follows_its_alignment(pc: PcEnv, fs: str) -> None:
    """Found by the soak (ext4): copy_file_range from an O_DIRECT fd at an unaligned
    offset is EINVAL (the splice fallback reads through O_DIRECT), where the model
    expected success. The model allows either answer there; the aligned copy still
    lands and is checked (clean run, no semantics finding)."""
    _, report = run(pc, WORKLOADS / "copy_range_direct.json", fs, rc=0)
    assert report["findings"] == [] and report["crash_states_checked"] > 0
