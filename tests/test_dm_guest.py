"""The `dm` backend for real: inside a Debian 6.12 kernel that has device-mapper and dm-log-writes.

This host's kernel has no device-mapper, so one guest boot (harness/backends/vm/hostroot.py:
the host's root shared read-only over 9p, tmpfs for /tmp, /run, /dev/shm) runs
tests/dm_guest_driver.py: `powercut run` of tests/workloads/small.sh on ext4, xfs and btrfs
with --backend auto (which must pick dm there) and with --backend fuse, and once with
--data-dev/--log-dev, and kills one dm run for `powercut cleanup`. The host then compares: same verdicts, and every dm log replays to the
dm run's final image byte for byte. One boot, several minutes under TCG (docs/dm-backend.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from common import vm
from conftest import ROOT, assert_log_replays_to
from harness.backends.vm.hostroot import run_in_guest
from harness.backends.vm.kernel import resolve
from foundation.runstate import RunState
from replay.logformat import END_MARK, METADATA, LogReader

pytestmark = [
    *vm,
]

KERNEL = "debian:linux-image-6.12-amd64"
FILE_SYSTEMS = ("ext4", "xfs", "btrfs")
MARKS = ["pc:mkfs-done", "pc:mounted", "f1-fsynced", "synced", "pc:workload-end", END_MARK]


@pytest.fixture(scope="module")
def guest_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dm-guest")
    state = RunState.create("dm guest test")
    try:
        res = run_in_guest(resolve(KERNEL), f"cd /tmp && {sys.executable} {ROOT}/tests/dm_guest_driver.py {out}",
                           str(out), state, timeout=1800)
    finally:
        state.teardown_or_warn()
    assert res.exit_code == 0, res.output[-3000:]
    assert res.kernel.startswith("6.12")
    print(f"guest boot + runs: {res.seconds:.0f} s")
    return out


def report(out: Path, name: str) -> dict:
    return json.loads((out / name / "report.json").read_text())


def test_every_run_passed_and_left_nothing(guest_out: Path) -> None:
    doc = json.loads((guest_out / "driver.json").read_text())
    assert doc["codes"] == {name: 0 for name in doc["codes"]} and len(doc["codes"]) == 8, doc
    assert doc["left"] == {"dm": [], "loop": []}


def test_cleanup_removes_the_target_of_a_killed_run(guest_out: Path) -> None:
    killed = json.loads((guest_out / "driver.json").read_text())["killed"]
    assert killed["ready"] and killed["targets_while_running"], killed  # killed while recording on dm
    assert killed["cleanup_code"] == 0 and killed["left"] == {"dm": [], "loop": []}, killed


def test_a_dm_run_states_the_dm_recorders_own_overhead(guest_out: Path) -> None:
    """The latency report of a dm run says what dm-log-writes itself adds to an fsync,
    measured in that invocation."""
    r = report(guest_out, "ext4-calibrated")
    cal = r["latency"]["recorder_overhead"]
    assert r["backend"] == cal["backend"] == "dm"
    # the fsyncs counted from outside (dm-log-writes logged a flush for each) and the ratio's direction
    assert cal["fsyncs"] > 0 and cal["log_flushes"] >= cal["fsyncs"], cal
    assert cal["ratio"] > 0 and (cal["ratio"] - 1) * (cal["recorder_p50_us"] - cal["loop_p50_us"]) >= 0, cal
    assert "through the kernel's dm-log-writes vs" in (guest_out / "ext4-calibrated" / "report.md").read_text()


@pytest.mark.parametrize("fs", FILE_SYSTEMS)
def test_auto_picks_dm_and_agrees_with_fuse(guest_out: Path, fs: str) -> None:
    dm, fuse = report(guest_out, f"{fs}-auto"), report(guest_out, f"{fs}-fuse")
    assert (dm["backend"], fuse["backend"]) == ("dm", "fuse")
    assert dm["kernel"] == fuse["kernel"] and dm["kernel"].startswith("6.12")
    assert [f["kind"] for f in dm["findings"]] == [f["kind"] for f in fuse["findings"]]
    assert dm["crash_points"] == fuse["crash_points"] == len(MARKS)


@pytest.mark.parametrize("name", [f"{fs}-auto" for fs in FILE_SYSTEMS] + ["ext4-user"])
def test_kernel_log_has_the_marks_and_flags_and_replays_to_the_final_image(guest_out: Path, name: str) -> None:
    r = report(guest_out, name)
    run = guest_out / name
    with LogReader(str(run / r["log"])) as reader:
        entries = list(reader.entries())
        assert [e.mark for e in entries if e.is_mark] == MARKS
        # Flags as the kernel logs them: FUA (journal commits, super blocks) and METADATA.
        assert any(e.is_fua for e in entries) and any(e.flags & METADATA for e in entries)
        final = run / "final.img"
        if name == "ext4-user":
            assert not final.exists()  # the user's device is theirs: no copy is made
        else:
            assert_log_replays_to(reader, r["device_bytes"], final, run)
