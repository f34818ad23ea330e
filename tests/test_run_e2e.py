"""`powercut run` end to end: real FUSE recorder, loop devices, mkfs, mount and fsck."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from common import report
from conftest import POWERCUT, WORKLOADS, PcEnv, needs_root_stack

pytestmark = [pytest.mark.e2e, needs_root_stack]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@pytest.mark.parametrize("fs", ["ext4", "xfs", "btrfs"])
def test_mixed_workload_is_clean_and_log_replays_to_final_image(pc: PcEnv, fs: str) -> None:
    out = pc.tmp / "out"
    pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", fs, "--out", str(out), "--keep-image", check_rc=0)
    r = report(out)
    assert r["workload"]["exit_code"] == 0, (out / "workload.out").read_text()
    assert r["fs"] == fs and r["backend"] == "fuse" and r["kernel"] == os.uname().release
    assert r["findings"] == []
    # Every crash point has at least its in-order state; reordered ones come on top.
    assert r["crash_states_checked"] + r["crash_states_duplicate"] == r["crash_states_total"] >= r["crash_points"] > 5
    assert r["log_entries"] > 20
    # The whole log replayed onto a zeroed device is the final device, byte for byte.
    replayed = pc.tmp / "replayed.img"
    pc.run("replay-log", "--log", str(out / r["log"]), "--replay", str(replayed),
           "--size", str(r["device_bytes"]), check_rc=0)
    assert replayed.stat().st_size == (out / "final.img").stat().st_size
    assert sha256(replayed) == sha256(out / "final.img")


def test_unjournaled_ext4_metadata_workload_has_fsck_findings(pc: PcEnv) -> None:
    out = pc.tmp / "out"
    p = pc.run("run", str(WORKLOADS / "metadata_heavy.sh"), "--fs", "ext4", "--mkfs-opts", "-O ^has_journal",
               "--known-damage-findings", "--crash-points", "write", "--out", str(out), check_rc=1)
    r = report(out)
    kinds = {f["kind"] for f in r["findings"]}
    assert kinds == {"fsck"}, r["findings"][:3]
    first = r["findings"][0]
    assert first["crash_point"] < r["log_entries"]
    assert first["evidence"]["fsck_code"] & 4
    assert "WARNING: Filesystem still has errors" in first["evidence"]["fsck_output"]
    assert "findings: fsck" in p.stdout
    # Fewer findings than states: most states between syncs are fine, the checker discriminates.
    assert len(r["findings"]) < r["crash_states_checked"]


def test_same_workload_with_journal_is_clean_at_every_write(pc: PcEnv) -> None:
    out = pc.tmp / "out"
    pc.run("run", str(WORKLOADS / "metadata_heavy.sh"), "--fs", "ext4", "--crash-points", "write",
           "--out", str(out), check_rc=0)
    assert report(out)["findings"] == []


@pytest.mark.parametrize("args,message", [
    (["--fs", "zfs"], "unknown --fs 'zfs'"),
    (["--fs", "xfs", "--size", "64"], "too small for xfs"),
    (["--fs", "ext4", "--crash-points", "sometimes"], "--crash-points"),
    (["--fs", "ext4", "--backend", "nbd"], "unknown --backend"),
])
def test_bad_arguments_exit_2_with_one_line(pc: PcEnv, args: list[str], message: str) -> None:
    p = pc.run("run", str(WORKLOADS / "mixed.sh"), *args, "--out", str(pc.tmp / "out"), check_rc=2)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("powercut: ") and message in lines[0], p.stderr


def test_missing_fsck_binary_is_a_clear_error(pc: PcEnv, tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ["mkfs.ext4", "mount", "umount", "losetup", "fusermount3", "bash"]:
        for d in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]:
            if os.path.exists(f"{d}/{tool}"):
                (bindir / tool).symlink_to(f"{d}/{tool}")
                break
    p = pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--out", str(pc.tmp / "out"),
               env=pc.env(PATH=str(bindir)), check_rc=2)
    assert p.stderr.strip() == "powercut: e2fsck not found: run `make deps` (or install the package that has it)"


def test_refuses_output_dir_it_did_not_create(pc: PcEnv) -> None:
    out = pc.tmp / "precious"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    p = pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--out", str(out), check_rc=2)
    assert "not created by powercut" in p.stderr
    assert (out / "keep.txt").read_text() == "user data" and sorted(os.listdir(out)) == ["keep.txt"]


def start_blocked_run(pc: PcEnv) -> tuple[subprocess.Popen[str], Path]:
    """Start `powercut run` whose workload blocks mid-way; return once it is blocked.

    The workload writes a file, then reports through a FIFO and blocks on a
    second FIFO: the device, mounts and daemon are all live at that point.
    """
    started, hold = pc.tmp / "started.fifo", pc.tmp / "hold.fifo"
    os.mkfifo(started)
    os.mkfifo(hold)
    script = pc.tmp / "blocking.sh"
    script.write_text(f"echo hello > f; sync f; echo up > {started}; read x < {hold}\n")
    proc = subprocess.Popen([*POWERCUT, "run", str(script), "--fs", "ext4", "--out", str(pc.tmp / "out")],
                            env=pc.env(), cwd=pc.tmp, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with open(started) as f:  # blocks until the workload is running on the mounted device
        assert f.read().strip() == "up"
    assert pc.leftovers(), "the run should hold a loop device, mounts and a daemon now"
    return proc, hold


def test_kill_9_then_cleanup_leaves_nothing(pc: PcEnv) -> None:
    proc, hold = start_blocked_run(pc)
    proc.kill()
    proc.wait()
    assert pc.leftovers(), "kill -9 cannot clean up: something must still be there"
    p = pc.run("cleanup", check_rc=0)
    assert "1 dead run(s) cleaned" in p.stdout
    assert pc.leftovers() == []
    # Nothing of the killed run remains in the state directory either.
    assert os.listdir(pc.state) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_tears_everything_down(pc: PcEnv, sig: signal.Signals) -> None:
    proc, hold = start_blocked_run(pc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], err   # the README's codes
    assert pc.leftovers() == [], err
    assert os.listdir(pc.state) == []


def test_cleanup_ignores_live_runs(pc: PcEnv) -> None:
    proc, hold = start_blocked_run(pc)
    try:
        p = pc.run("cleanup", check_rc=0)
        assert "0 dead run(s) cleaned" in p.stdout
        assert pc.leftovers(), "a live run's resources must not be touched"
    finally:
        with open(hold, "w") as f:
            f.write("go\n")
        proc.communicate(timeout=300)
    assert proc.returncode == 0


def test_cleanup_leaves_a_nested_state_root_to_its_own_cleanup(pc: PcEnv) -> None:
    """A state root inside another (a joined test's machine m2 in the test's state) is not a run
    without an owner: the outer cleanup once deleted its journal, leaving its mounts to no one."""
    pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--out", str(pc.tmp / "first"), check_rc=0)
    nested = PcEnv(pc.state / "m2", pc.scratch / "m2", pc.tmp)
    proc, _hold = start_blocked_run(nested)
    proc.kill()
    proc.wait()
    journals = list(nested.state.glob("*/resources.jsonl"))
    assert journals
    pc.run("cleanup", check_rc=0)
    assert all(j.exists() for j in journals) and nested.leftovers()
    p = pc.run("cleanup", env=nested.env(), check_rc=0)
    assert "1 dead run(s) cleaned" in p.stdout and nested.leftovers() == []
