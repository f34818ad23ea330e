"""f2fs through the vm backend on a host whose kernel may lack it: the guest kernel records,
recovers and (for the content oracle) reads every crash image; the host runs fsck.f2fs."""

from __future__ import annotations

import pytest

from common import report, vm
from conftest import WORKLOADS, PcEnv

pytestmark = [*vm]

KERNEL = "debian:linux-image-6.12.117+deb12-amd64"


def _run(pc: PcEnv, workload: str, *extra: str, rc: int, fs: str = "f2fs") -> dict:
    out = pc.tmp / "out"
    # The guest reads the images for the oracle whether or not this host could mount f2fs.
    pc.run("run", str(WORKLOADS / workload), "--fs", fs, "--backend", "vm", "--kernel", KERNEL,
           *extra, "--out", str(out), check_rc=rc, env=pc.env(POWERCUT_CONTENT_READER="guest"))
    assert pc.leftovers() == []
    return report(out)


def test_f2fs_shell_workload_is_recovered_by_the_guest_and_checked_by_fsck_f2fs(pc: PcEnv) -> None:
    r = _run(pc, "mixed.sh", rc=0)
    assert r["fs"] == "f2fs" and r["findings"] == []
    assert r["recovery_checks"] == {"rw": r["crash_states_checked"]} and r["crash_states_checked"] > 5
    consoles = "".join(p.read_text() for p in sorted((pc.tmp / "out").glob("vm-boot-*.console")))
    assert "F2FS-fs" in consoles  # the guest's f2fs module mounted the images


def test_f2fs_content_oracle_reads_what_the_guest_read(pc: PcEnv) -> None:
    r = _run(pc, "rename_fsync.json", rc=0)
    assert "reads the recovered tree" in r["vm"]["content_checks"]
    assert r["oracle"]["ops_modelled"] > 0 and not r["oracle"]["lost_track"]


@pytest.mark.parametrize("fault", ["drop-flush"])
def test_f2fs_dropped_flushes_are_durability_findings(pc: PcEnv, fault: str) -> None:
    r = _run(pc, "rename_fsync.json", "--fault", fault, rc=1)
    assert "durability" in {f["kind"] for f in r["findings"]}


def test_a_guest_read_tree_keeps_hundreds_of_xattrs(pc: PcEnv) -> None:
    """The tree the guest read is rebuilt on the host where a file can hold 400 x 1 KiB of xattrs
    (xfs keeps them all; the host's ext4 state directory held 3: ENOSPC, a worker's internal error)."""
    r = _run(pc, "many_xattrs_fsync.json", rc=0, fs="xfs")
    assert "reads the recovered tree" in r["vm"]["content_checks"]
    assert r["oracle"]["ops_modelled"] > 0 and not r["oracle"]["lost_track"]


def test_f2fs_atomic_batches_are_clean_on_a_healthy_kernel(pc: PcEnv) -> None:
    """SQLite's sequence (start, writes, commit; an abort; a replace) on the guest's f2fs: every
    ioctl succeeds, the batches' writes are classified at the states from their commits on, none torn."""
    r = _run(pc, "f2fs_atomic_write.json", rc=0)
    assert r["findings"] == [] and not r["oracle"]["lost_track"]
    ioctls = r["latency"]["kinds"]["f2fs_atomic"]
    assert ioctls["count"] == 8 and ioctls["errors"] == 0
    assert r["torn_writes"]["states"] > 0 and r["torn_writes"]["states_torn"] == 0


def test_a_planted_half_committed_batch_is_an_atomicity_finding(pc: PcEnv) -> None:
    """PC_EXEC_FAULT=early-commit: the executor commits each batch after its first write (unrecorded),
    so the rest of it lands as plain writes later: states with half a committed batch."""
    out = pc.tmp / "out"
    pc.run("run", str(WORKLOADS / "f2fs_atomic_write.json"), "--fs", "f2fs", "--backend", "vm", "--kernel", KERNEL,
           "--out", str(out), check_rc=1, env=pc.env(PC_EXEC_FAULT="early-commit"))
    assert pc.leftovers() == []
    found = [f for f in report(out)["findings"] if f["kind"] == "atomicity"]
    assert found and {f["evidence"]["rule"] for f in found} == {"f2fs-atomic-write"}
    assert all(f["evidence"]["new_ranges"] and f["evidence"]["old_ranges"] for f in found)
