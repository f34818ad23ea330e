"""Recovery under test: read-only recovery (--recovery) and a power cut during recovery (--recovery-crash).

Real stack throughout: the FUSE recorder records the workload and then each
recovery mount; the host kernel recovers; e2fsck/xfs_repair/btrfs check and
the content oracle judge.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from common import report
from conftest import WORKLOADS, PcEnv, needs_root_stack
from checkers.crashwalk.recovery_crash import RecoveryCrashSpec
from checkers.crashwalk.recovery_modes import mode_opts, parse_recovery
from foundation.errors import UsageError
from replay.crashstates import join_recovery_id, split_recovery_id
from replay.logformat import LogReader


# -- units -------------------------------------------------------------------------

def test_recovery_ids_round_trip() -> None:
    assert split_recovery_id("p57") == ("p57", None)
    assert split_recovery_id("p57-d33/r12-d10") == ("p57-d33", "p12-d10")
    assert join_recovery_id("p57-d33", "p12-d10") == "p57-d33/r12-d10"
    with pytest.raises(UsageError):
        split_recovery_id("p57/x12")


def test_recovery_options_are_checked() -> None:
    assert parse_recovery("both") == ("rw", "ro") and parse_recovery("ro") == ("ro",)
    assert mode_opts("noatime", "ro") == "noatime,ro" and mode_opts("noatime", "rw") == "noatime"
    with pytest.raises(UsageError):
        parse_recovery("readonly")
    with pytest.raises(UsageError):
        RecoveryCrashSpec(budget=0)
    with pytest.raises(UsageError):
        RecoveryCrashSpec(rate=0)
    # The rate picks crash states by id: the same ones on every run, about RATE of them.
    spec = RecoveryCrashSpec(rate=0.25)
    picked = [i for i in range(400) if spec.chosen(f"p{i}", "rw")]
    assert picked == [i for i in range(400) if spec.chosen(f"p{i}", "rw")]
    assert 50 < len(picked) < 150


# -- end to end --------------------------------------------------------------------

def _state_at_mark(log: Path, mark: str) -> str:
    with LogReader(str(log)) as reader:
        return next(f"p{e.index}" for e in reader.entries() if e.mark == mark)


def _needs_recovery(fs: str, img: Path) -> bool:
    """Whether IMG still holds a journal/log that the next mount must replay."""
    if fs == "ext4":
        out = subprocess.run(["dumpe2fs", "-h", str(img)], capture_output=True, text=True).stdout
        return "needs_recovery" in next(line for line in out.splitlines() if line.startswith("Filesystem features"))
    if fs == "xfs":  # xfs_repair -n refuses an image whose log still needs replaying
        return subprocess.run(["xfs_repair", "-n", "-f", str(img)], capture_output=True).returncode != 0
    out = subprocess.run(["btrfs", "inspect-internal", "dump-super", str(img)], capture_output=True, text=True).stdout
    return next(line.split()[1] for line in out.splitlines() if line.startswith("log_root\t")) != "0"


@pytest.mark.e2e
@needs_root_stack
@pytest.mark.parametrize("fs", ["ext4", "xfs", "btrfs"])
def test_read_only_mount_recovers_on_disk(pc: PcEnv, fs: str) -> None:
    """The fact `--recovery ro` rests on: an `-o ro` mount replays the journal/log onto the
    disk, so fsck after it checks a recovered image (never an unrecovered one)."""
    out = pc.tmp / "out"
    pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", fs, "--reorder", "none", "--crash-points", "mark",
           "--jobs", "1", "--recovery", "ro", "--out", str(out), check_rc=0)
    r = report(out)
    assert r["recovery_checks"] == {"ro": r["crash_states_checked"]}
    img = pc.tmp / "crash.img"
    pc.run("crash-image", "--log", str(out / "recording.log"), "--state", _state_at_mark(out / "recording.log", "done"),
           "--size", str(r["device_bytes"]), "--out", str(img), check_rc=0)
    assert _needs_recovery(fs, img)
    loop = subprocess.run(["losetup", "--find", "--show", str(img)], capture_output=True, text=True,
                          check=True).stdout.strip()
    mnt = pc.tmp / "mnt"
    mnt.mkdir()
    try:
        subprocess.run(["mount", "-t", fs, "-o", "ro,nouuid" if fs == "xfs" else "ro", loop, str(mnt)], check=True)
        try:
            assert subprocess.run(["touch", str(mnt / "x")], capture_output=True).returncode != 0  # really read-only
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
    finally:
        subprocess.run(["losetup", "-d", loop])
    assert not _needs_recovery(fs, img)


@pytest.mark.e2e
@needs_root_stack
def test_both_recoveries_and_crashes_inside_them_are_clean_on_healthy_ext4(pc: PcEnv) -> None:
    out = pc.tmp / "out"
    p = pc.run("run", str(WORKLOADS / "fsync_then_more.json"), "--fs", "ext4", "--jobs", "2", "--recovery", "both",
               "--recovery-crash", "--recovery-crash-states", "4", "--out", str(out), check_rc=0)
    r = report(out)
    n = r["crash_states_checked"]
    assert r["findings"] == [] and r["recovery_checks"] == {"rw": n, "ro": n}
    rc = r["recovery_crash"]
    # Every crash state's recovery is recorded in both modes; each gives up to 4 states inside it.
    assert rc["recoveries_recorded"] == 2 * n and rc["recorded_mounts_failed"] == 0
    assert 2 * n < rc["states_checked"] <= 4 * rc["recoveries_recorded"]
    assert "recovery crash states checked" in p.stdout
    assert not (out / "recovery-logs").exists()  # kept only for findings
    assert pc.leftovers() == []


@pytest.mark.e2e
@needs_root_stack
def test_recovery_that_loses_its_flushes_is_caught_and_reproduces(pc: PcEnv) -> None:
    """Planted fault: the recorder drops the flushes the recovering kernel issues, so
    a crash inside recovery may keep the journal's reset but lose what it replayed."""
    out = pc.tmp / "out"
    pc.run("run", str(WORKLOADS / "fsync_then_more.json"), "--fs", "ext4", "--jobs", "2", "--recovery-crash",
           "--recovery-crash-states", "16", "--fault", "recovery-drop-flush", "--first-failure",
           "--out", str(out), check_rc=1)
    f = report(out)["findings"][0]
    original, inner = split_recovery_id(f["state_id"])
    assert inner is not None and f["recovery"] == "rw" and f["kind"] in ("fsck", "durability", "mount")
    assert "crash during rw recovery" in f["detail"]
    assert (out / "recovery-logs" / f"{original}.rw.log").exists()
    # The same state, rebuilt from the two logs, fails again; and its image can be built alone.
    p = pc.run("recheck", str(out), "--state", f["state_id"], check_rc=1)
    assert f["state_id"] in p.stdout
    image = ["crash-image", "--log", str(out / "recording.log"), "--state", f["state_id"],
             "--size", str(report(out)["device_bytes"])]
    pc.run(*image, "--out", str(pc.tmp / "inner.img"), check_rc=0)
    # --recovery-log: the recovery's log from anywhere (here moved away from its default place),
    # the same bytes; without it, the state cannot be built (one line, exit 2)
    moved = pc.tmp / "elsewhere.log"
    (out / "recovery-logs" / f"{original}.rw.log").rename(moved)
    pc.run(*image, "--out", str(pc.tmp / "moved.img"), "--recovery-log", str(moved), check_rc=0)
    assert (pc.tmp / "moved.img").read_bytes() == (pc.tmp / "inner.img").read_bytes()
    p = pc.run(*image, "--out", str(pc.tmp / "none.img"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert pc.leftovers() == []


@pytest.mark.e2e
@needs_root_stack
@pytest.mark.parametrize("args,message", [
    (["--recovery", "readonly"], "--recovery"),
    (["--recovery-crash", "--recovery-crash-states", "0"], "--recovery-crash-states"),
    (["--recovery-crash", "--recovery-crash-rate", "2"], "--recovery-crash-rate"),
    (["--recovery", "ro", "--mount-opts", "ro,noload"], "would not recover"),
])
def test_bad_recovery_arguments_exit_2(pc: PcEnv, args: list[str], message: str) -> None:
    p = pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", *args, "--out", str(pc.tmp / "out"), check_rc=2)
    assert message in p.stderr and len(p.stderr.strip().splitlines()) == 1
