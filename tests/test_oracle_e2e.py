"""The content oracle through the real stack: recorded device, crash images,
kernel recovery, and the files read back from each recovered image."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from conftest import WORKLOADS, PcEnv, needs_root_stack
from workloads.strategies import workloads

pytestmark = [pytest.mark.e2e, needs_root_stack]


def run_report(pc: PcEnv, workload: Path, *args: str, rc: int | None = None) -> dict:
    out = pc.tmp / "out"
    p = pc.run("run", str(workload), "--out", str(out), *args)
    assert p.returncode in ((0, 1) if rc is None else (rc,)), p.stderr
    return json.loads((out / "report.json").read_text())


def test_data_writeback_exposes_stale_data_and_ordered_does_not(pc: PcEnv) -> None:
    wl = WORKLOADS / "stale_writeback.json"
    # The window needs new's 16 MiB still unwritten when other's fsync commits the journal. A
    # sync(2) from any other process on the machine (a parallel test session, a soak) writes
    # them back first, and then no crash state can show stale data: that run proves nothing
    # either way. So up to three runs; each must be clean or show exactly this finding.
    for _ in range(3):
        r = run_report(pc, wl, "--fs", "ext4", "--size", "32", "--mount-opts", "data=writeback,nodelalloc")
        assert {f["kind"] for f in r["findings"]} <= {"stale-data"}, r["findings"]
        if r["findings"]:
            break
        shutil.rmtree(pc.tmp / "out")
    stale = [f for f in r["findings"] if f["kind"] == "stale-data"]
    assert stale and {f["kind"] for f in r["findings"]} == {"stale-data"}
    f = stale[0]
    assert f["evidence"]["path"] == "new" and f["evidence"]["rule"] == "no-stale-data"
    # The exposed bytes are the deleted file's: a chunk written by op 1 (old's pwrite).
    assert "op 1 " in f["evidence"]["found"] and f["evidence"]["hexdump"]
    assert f["crash_point"] is not None and f["crash_mark"].startswith("op ")
    shutil.rmtree(pc.tmp / "out")
    assert run_report(pc, wl, "--fs", "ext4", "--size", "32", rc=0)["findings"] == []


@pytest.mark.parametrize("fs", ["ext4", "xfs", "btrfs"])
def test_a_failed_direct_write_is_no_finding(pc: PcEnv, fs: str) -> None:
    """The misaligned O_DIRECT pwrite: ext4 writes the aligned first block, then
    returns EINVAL; xfs returns EINVAL having written nothing; btrfs falls back to
    buffered I/O and succeeds (kernel 6.18). Every crash state is clean all the same."""
    r = run_report(pc, WORKLOADS / "failed_direct_write.json", "--fs", fs)
    assert r["findings"] == [] and r["crash_states_checked"] > 0


@pytest.mark.parametrize("fs", ["ext4", "xfs"])
def test_recorder_loss_window_at_every_crash_point(pc: PcEnv, fs: str) -> None:
    r = run_report(pc, WORKLOADS / "mini_recorder.json", "--fs", fs, rc=0)
    d = r["design"]["records"]
    # One row per crash state checked (a crash point has its in-order state and reordered ones).
    assert len(d["rows"]) == r["crash_states_checked"] and d["crash_points"] <= r["crash_points"]
    rows = d["rows"]
    # Before the final fsync nothing durable was promised: some crash points lose records;
    # after it, all 48 records are back.
    assert d["max_loss_records"] > 0
    assert rows[-1]["written"] == rows[-1]["recovered"] == 48
    assert all(x["loss_ms"] == x["loss_records"] * 5 for x in rows)


@pytest.mark.parametrize("fs", ["ext4", "xfs", "btrfs"])
def test_random_workloads_are_clean_on_healthy_file_systems(pc: PcEnv, fs: str) -> None:
    """No false positives: random workloads on a healthy fs give no finding at all.
    (`make soak` runs many more; docs/fuzzing.md records the counts.)"""
    seen = []

    @settings(max_examples=4, deadline=None, database=None, derandomize=True,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(workloads(5, 12))
    def check(doc: dict) -> None:
        path = pc.tmp / f"w{len(seen)}.json"
        doc["name"] = f"rand{len(seen)}"
        path.write_text(json.dumps(doc))
        out = pc.tmp / f"out{len(seen)}"
        seen.append(path)
        p = pc.run("run", str(path), "--fs", fs, "--out", str(out))
        assert p.returncode == 0, f"{path}:\n{p.stdout}\n{p.stderr}"

    check()
    assert len(seen) == 4


def test_a_disk_that_lies_about_flushes_loses_fsynced_data(pc: PcEnv) -> None:
    """The recorder's test-only fault mode drops FLUSH entries: every write since mkfs is one
    flush epoch, so reordered crash states may drop writes fsync had waited for."""
    wl = WORKLOADS / "fsync_then_more.json"
    r = run_report(pc, wl, "--fs", "ext4", "--fault", "drop-flush", "--reorder", "drop-one", rc=1)
    lost = [f for f in r["findings"] if f["kind"] == "durability"]
    assert lost, r["findings"][:3]
    assert any("fsync" in f["evidence"].get("op", "") for f in lost)
    shutil.rmtree(pc.tmp / "out")
    # The same workload and reordering on an honest recorder: nothing.
    assert run_report(pc, wl, "--fs", "ext4", "--reorder", "drop-one", rc=0)["findings"] == []
