"""Scenarios and the latency report end to end: real FUSE recorder, loop device, mkfs, mount, fsck."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from matplotlib.image import imread

from checkers.latency import summarize
from common import report
from conftest import POWERCUT, PcEnv, needs_root_stack
from harness.reports.markdown import STAT_COLUMNS
from workloads import scenarios
from workloads.format import FORMAT, load_workload
from workloads.results import read_records

pytestmark = [pytest.mark.e2e, needs_root_stack]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_figures(out: Path, r: dict[str, Any]) -> None:
    """Every figure report.json names exists, is a PNG matplotlib can read back, and report.md shows it."""
    md = (out / "report.md").read_text()
    plots = r["latency"]["plots"]
    assert plots and "barrier" not in plots
    for files in plots.values():
        for rel in files.values():
            data = (out / rel).read_bytes()
            assert data.startswith(PNG_MAGIC) and len(data) > 5000, rel
            h, w, _ = imread(out / rel).shape
            assert (w, h) == (750, 420), rel
            assert f"]({rel})" in md


def test_recorder_on_ext4_checks_every_crash_point_and_prints_table_1(pc: PcEnv) -> None:
    out = pc.tmp / "out"
    p = pc.run("run", "scenario:recorder", "--fs", "ext4", "--backend", "fuse", "--scale", "0.01", "--out", str(out))
    r = report(out)
    # Exit 1 only for the design findings below (a loaded machine makes them likelier).
    assert p.returncode == (1 if r["findings"] else 0) and {f["kind"] for f in r["findings"]} <= {"design"}, p.stderr
    # Zero fsck and mount findings. (A `design` finding — a record torn inside the
    # surviving prefix — is what the recorder design may legitimately show: it
    # never fsyncs records, and writeback order is not file order.)
    assert not [f for f in r["findings"] if f["kind"] in ("fsck", "mount", "durability", "stale-data")], r["findings"][:3]
    # Every crash point has at least its in-order state; reordered ones come on top.
    assert r["crash_states_checked"] + r["crash_states_duplicate"] == r["crash_states_total"] >= r["crash_points"] > 300
    assert r["crash_point_kinds"] == "flush,fua,mark"
    assert r["mount_opts"] == "noatime,lazytime"  # the paper's, the scenario's default
    lat = r["latency"]
    for kind in ("fallocate", "write", "sync_file_range", "ftruncate", "fsync"):
        assert set(STAT_COLUMNS) <= set(lat["kinds"][kind]), kind
    assert lat["kinds"]["write"]["count"] == 160 and lat["threads"]["recorder"]["write"]["count"] == 160
    assert set(lat["threads"]) == {"recorder", "syncer", "post", "background"}
    assert 0 < lat["overhead_ns"]["min"] <= lat["overhead_ns"]["median"]
    assert lat["between_ops"]["count"] > 200
    table1 = r["scenario"]["table1"]
    assert [row["background"] for row in table1.values()] == ["none", "ftruncate + fsync"]
    # Hand-computed from the paper's parameters at scale 0.01: 8000 writes per phase -> 80; 20
    # recordings (one fallocate each) -> 0.2, raised to the scenario's documented floor of 2.
    for row in table1.values():
        assert (row["writes"], row["fallocates"]) == (80, 2), row
        assert 0 < row["write_avg_us"] <= row["write_max_us"] and 0 < row["fallocate_avg_us"] <= row["fallocate_max_us"]
    # Table 1 (the scenario's per-phase groups) agrees with the latency summary (per thread and
    # kind), a second path over the same records.
    rec = lat["threads"]["recorder"]
    # The phases' groups are a subset of the thread's ops (the recorder also fallocates outside
    # them), so their counts and maxima are bounded by the thread's.
    assert sum(row["writes"] for row in table1.values()) == rec["write"]["count"]
    assert max(row["write_max_us"] for row in table1.values()) <= rec["write"]["max_us"]
    assert sum(row["fallocates"] for row in table1.values()) <= rec["fallocate"]["count"]
    assert max(row["fallocate_max_us"] for row in table1.values()) <= rec["fallocate"]["max_us"]
    md = (out / "report.md").read_text()
    # (141) ... (1043): Table 1 of Okabe & Toyama as published, beside each measured cell
    for text in ("## Latency", "### Thread `syncer`", "Table 1", "| none | ", "| ftruncate + fsync | ",
                 "(141)", "(4299)", "(178)", "(359)", "(813)", "(208440)", "(181)", "(1043)", "rerun",
                 "## Records after a crash"):
        assert text in md, text
    assert_figures(out, r)
    # The saved workload is exactly the scenario's: rerunnable with `powercut run OUT/workload.json`.
    assert json.loads((out / "workload.json").read_text()) == scenarios.document("recorder", 0.01)
    assert f"powercut run {out}/workload.json --fs ext4 --mount-opts noatime,lazytime" in md
    # report.json's latency is what the records say
    w = load_workload(out / "workload.json")
    again = summarize(read_records(out / "records.bin", w), w)
    assert again["kinds"] == lat["kinds"] and again["threads"] == lat["threads"]


BUDGETED = {"format": FORMAT, "name": "budgeted", "threads": [{"name": "t", "ops": [
    {"op": "open", "path": "f", "flags": ["O_CREAT", "O_WRONLY"], "fd": "f"},
    {"op": "repeat", "count": 8, "ops": [{"op": "write", "fd": "f", "length": 4096}]},
    {"op": "fsync", "fd": "f"}, {"op": "close", "fd": "f"}]}]}


@pytest.mark.parametrize("limit_us,expect_rc", [(0.001, 1), (1e9, 0)])
def test_budgets_turn_into_latency_findings_through_powercut_run(pc: PcEnv, limit_us: float, expect_rc: int) -> None:
    path = pc.tmp / "w.json"
    path.write_text(json.dumps({**BUDGETED, "budgets": {"write": {"max_us": limit_us}, "fsync": {"p99_us": limit_us}}}))
    out = pc.tmp / "out"
    p = pc.run("run", str(path), "--fs", "ext4", "--out", str(out), check_rc=expect_rc)
    r = report(out)
    found = [(f["kind"], f["evidence"]["op"], f["evidence"]["budget"]) for f in r["findings"]]
    if expect_rc:
        assert found == [("latency", "fsync", "p99_us"), ("latency", "write", "max_us")]
        assert r["latency"]["kinds"]["write"]["budget_violations"] == 8
        md = (out / "report.md").read_text()
        assert "findings: latency 2" in p.stdout and "| latency |" in md and "None:" not in md
    else:
        assert found == [] and r["latency"]["kinds"]["write"]["budget_violations"] == 0
    assert_figures(out, r)


def test_fsync_loop_across_mount_options_in_one_report(pc: PcEnv) -> None:
    out = pc.tmp / "out"
    # In-order crash states: this compares latency. With reordering, barrier=0 loses fsync'd data
    # (test_explore.py::test_the_content_oracle_finds_a_missing_flush).
    pc.run("run", "scenario:fsync-loop", "--fs", "ext4", "--scale", "0.005", "--reorder", "none",
           "--mount-opts-matrix", "barrier=1;barrier=0", "--device-profile", "nvme", "--out", str(out), check_rc=0)
    c = report(out)
    assert c["device_profile"]["name"] == "nvme"  # the comparison says which device every variant played
    assert [v["label"] for v in c["variants"]] == ["barrier=1", "barrier=0"] and c["dimension"] == "mount options"
    for v in c["variants"]:
        own = report(out / v["dir"])
        assert own["mount_opts"] == v["label"] and own["findings"] == [] and v["findings"] == 0
        assert own["device_profile"] == c["device_profile"]
        # One in-order state per crash point; those whose image an earlier one had are skipped.
        assert own["crash_states_checked"] + own["crash_states_duplicate"] == own["crash_points"]
        assert own["crash_states_checked"] == v["crash_states_checked"]
        assert v["latency"]["fsync"]["count"] == own["scenario"]["fsync"]["count"] == 20
        assert set(v["headline"]) == {"fsync avg us", "fsync p99 us", "fsync max us", "4096 iterations s"}
    with_barriers, without = c["variants"]
    assert with_barriers["crash_points"] > without["crash_points"]  # barrier=0: no flushes in the log
    md = (out / "report.md").read_text()
    assert "| barrier=1 | barrier=1 |" in md and "## fsync" in md and "| 4096 iterations s |" in md
    assert "Device profile `nvme` played by the recorder" in md
    assert (out / c["plots"]["fsync"]).read_bytes().startswith(PNG_MAGIC)


def test_fsync_under_load_sets_the_queue_depth(pc: PcEnv) -> None:
    out = pc.tmp / "out"
    pc.run("run", "scenario:fsync-under-load", "--fs", "ext4", "--scale", "0.01", "--param", "queue_depth=4",
           "--param", "writers=3", "--out", str(out), check_rc=0)
    r = report(out)
    assert r["device_tuning"] == {"queue/nr_requests": "4"} and r["crash_point_kinds"] == "flush,fua"
    s = r["scenario"]
    assert s["queue_depth"] == "4" and s["fsync"]["count"] == 4 and s["append"]["count"] > 0  # the writers wrote
    assert set(r["latency"]["threads"]) == {"small", "writer0", "writer1", "writer2"}
    p = pc.run("run", "scenario:fsync-under-load", "--fs", "ext4", "--scale", "0.01", "--param", "queue_depth=100000",
               "--out", str(pc.tmp / "bad"), check_rc=2)
    assert p.stderr.startswith("powercut: device.queue.nr_requests: /sys/block/loop") and len(p.stderr.splitlines()) == 1


def test_recording_streams_count_extents_and_time_removal(pc: PcEnv) -> None:
    out = pc.tmp / "out"
    pc.run("run", "scenario:recording-streams", "--fs", "ext4", "--scale", "0.01", "--param", "records=4",
           "--param", "streams=3", "--param", "record_bytes=262144", "--out", str(out), check_rc=0)
    phases = report(out)["scenario"]["phases"]
    for ph in ("plain", "fallocate"):
        assert len(phases[ph]["extents_per_file"]) == 3 and min(phases[ph]["extents_per_file"]) >= 1
        assert phases[ph]["removal_max_ms"] <= phases[ph]["removal_total_ms"] and phases[ph]["write_errors"] == 0
    unlink = report(out)["latency"]["kinds"]["unlink"]
    assert unlink["count"] == 6
    # the removal times are the unlinks' own: the latency summary (another path over the same
    # records) has the same slowest one
    assert max(phases[ph]["removal_max_ms"] for ph in phases) * 1000 == pytest.approx(unlink["max_us"], abs=1)
    assert "| fallocate | " in (out / "report.md").read_text()


def test_lprobe_reports_the_write_distribution_and_writeback_settings(pc: PcEnv) -> None:
    out = pc.tmp / "out"
    pc.run("run", "scenario:lprobe", "--fs", "ext4", "--scale", "0.003", "--param", "dirty_limit_bytes=1048576",
           "--param", "bg_bytes=262144", "--param", "bg_block=262144",
           "--out", str(out), check_rc=0)
    r = report(out)
    s = r["scenario"]
    assert s["writes"]["count"] == sum(s["distribution"].values()) > 0
    assert s["slow_writes"] == len(s["slow_write_times"]) == sum(v for k, v in s["distribution"].items() if k.startswith(">="))
    assert s["sysctls"]["vm.dirty_ratio"] and r["device_tuning"]["bdi/strict_limit"] == "1"
    assert r["crash_states_checked"] + r["crash_states_duplicate"] == r["crash_states_total"] >= r["crash_points"]
    assert r["findings"] == []
    assert "Writeback settings in force: vm.dirty_ratio = " in (out / "report.md").read_text()


def _plotter_of(out: Path) -> list[int]:
    """Processes drawing OUT's figures (harness.reports.plots names OUT in its command line)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"harness.reports.plots" in argv and str(out).encode() in argv:
            pids.append(int(pid))
    return pids


def test_ctrl_c_while_the_figures_are_drawn(pc: PcEnv) -> None:
    """The figures are drawn by a child process during the crash walk; a Ctrl-C at the
    terminal (SIGINT to the whole process group) ends the run with one line, and the
    child goes with it."""
    out = pc.tmp / "out"
    proc = subprocess.Popen([*POWERCUT, "run", "scenario:recorder", "--fs", "ext4", "--scale", "0.01",
                             "--out", str(out)], env=pc.env(), cwd=pc.tmp, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not _plotter_of(out):
        assert proc.poll() is None, "the run ended before its figures were being drawn"
        assert time.monotonic() < deadline
        time.sleep(0.02)  # a poll interval: the condition is the child's existence
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "powercut: interrupted" and "Traceback" not in err, err
    assert _plotter_of(out) == []
    assert pc.leftovers() == []
