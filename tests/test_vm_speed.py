"""Speed in the guest (issue 24): the faster recovery path must find what the slow one found.

The guest's recovery mounts run in one process (pc-recover) and the host's
content checks share read-only loop devices; none of it may lose a finding.
The known btrfs bug of Debian's 6.12.117 (generic/764's shape: fsync of a
file whose last link is gone does not persist the deletion; fixed upstream
by "btrfs: fix fsync of files with no hard links not persisting deletion")
is found by an exhaustive seq-1 campaign through the whole stack. And
`bench --only vm` reports fuse and vm workloads/min on campaign workloads
and their ratio, measured side by side; `bench --only recorder --backend dm
--kernel K` measures the kernel's dm-log-writes in a guest of K (this host
has no dm), the part of `make bench` that needs --kernel besides the vm one.
"""

from __future__ import annotations

import json
import os

import pytest

from common import KERNEL_612, vm
from conftest import PcEnv
from harness.backends.dm import support as dm_support

pytestmark = vm  # boots QEMU guests: root for apt-get, the kernel cache and scratch dirs

BUGGY = "debian:linux-image-6.12.117+deb12-amd64"


def test_the_known_btrfs_fsync_unlink_bug_is_found_through_the_batched_guest(pc: PcEnv) -> None:
    out = pc.tmp / "campaign"
    p = pc.run("fuzz", "--out", str(out), "--fs", "btrfs", "--backend", "vm", "--kernel", BUGGY,
               "--engine", "exhaustive", "--seq", "1", "--core-ops", "unlink-open", "--max-findings", "1",
               "--shrink-seconds", "1", "--duration", "20m", timeout=2400)
    assert p.returncode == 1, p.stdout + p.stderr
    report = json.loads((out / "report.json").read_text())
    saved = report["saved_findings"]
    assert saved and report["harness_errors"] == 0 and report["failed_workers"] == []
    finding = json.loads((out / "findings" / saved[0]["dir"] / "finding.json").read_text())
    # What the fsync promised (the unlinked file is gone) did not survive the crash.
    assert finding["kind"] == "durability", finding
    assert finding["original_workload"]["name"].startswith("seq1-unlink-open."), finding["original_workload"]["name"]
    assert pc.leftovers() == []


def test_bench_reports_fuse_and_vm_rates_on_campaign_workloads_and_their_ratio(pc: PcEnv) -> None:
    out = pc.tmp / "bench.json"
    pc.run("bench", "--only", "vm", "--quick", "--kernel", KERNEL_612, "--json", str(out),
           check_rc=0, timeout=1800)
    b = json.loads(out.read_text())
    vm = b["details"]["vm"]
    # The same campaign workloads on both sides, spread over the seq-1 space (not its first ones).
    assert vm["fs"] == "btrfs" and vm["vm"]["workloads"] == vm["fuse"]["workloads"] == vm["workloads"] == 3
    assert len({name.split(".")[0] for name in vm["names"]}) == 3, vm["names"]   # three different core ops
    assert vm["vm"]["crash_states"] > 0 and vm["fuse"]["crash_states"] > 0
    assert b["vm_seq1_workloads_per_min_per_worker"] == vm["vm"]["workloads_per_min"]
    assert b["fuse_seq1_workloads_per_min_per_worker"] == vm["fuse"]["workloads_per_min"]
    expect = vm["fuse"]["workloads_per_min"] / vm["vm"]["workloads_per_min"]
    assert b["vm_cost_over_fuse"] == pytest.approx(expect, rel=0.02)
    # one boot for all workloads; the guest ran both kinds of job (the keys are the jobs that ran)
    assert vm["cost_per_workload_s"]["boots"] == 1
    assert {"guest_record", "guest_recover"} <= set(vm["cost_per_workload_s"]), vm["cost_per_workload_s"]
    assert pc.leftovers() == []


def test_bench_kernel_measures_the_dm_recorder_in_a_guest_of_that_kernel(pc: PcEnv) -> None:
    """The dm recorder's fsync overhead where this kernel has no dm-log-writes: measured in a
    guest of --kernel (the host's root over 9p), the JSON brought back to the host."""
    out = pc.tmp / "bench.json"
    pc.run("bench", "--only", "recorder", "--backend", "dm", "--quick", "--kernel", KERNEL_612, "--json", str(out),
           check_rc=0, timeout=1800)
    b = json.loads(out.read_text())
    fsync = b["details"]["fsync"]
    assert set(b) == {"recorder_fsync_p50_ratio", "details"} and b["recorder_fsync_p50_ratio"] == fsync["ratio"]
    # the kernel's dm-log-writes, not the fuse recorder; where it ran says which kernel
    assert fsync["backend"] == "dm", fsync
    if dm_support.missing():
        assert fsync["where"].startswith("guest 6.12.") and fsync["where"].endswith(" under TCG"), fsync
    else:
        assert fsync["where"] == f"host {os.uname().release}", fsync
    # every fsync the bench claims, counted again in dm-log-writes' own log; the ratio's direction
    assert fsync["log_flushes"] >= fsync["fsyncs"] > 0, fsync
    assert (fsync["ratio"] - 1) * (fsync["recorder_p50_us"] - fsync["loop_p50_us"]) >= 0, fsync
    assert pc.leftovers() == []


def test_bench_campaign_runs_fuzz_on_vm_then_fuse_with_the_same_workloads_and_the_state_profile(pc: PcEnv) -> None:
    """`bench --only campaign`: real `powercut fuzz` campaigns on both backends, the fuse one
    capped at the vm one's workload count; steady rates without the boots; where a guest
    crash state's time went."""
    out = pc.tmp / "campaign.json"
    pc.run("bench", "--only", "campaign", "--kernel", KERNEL_612, "--fs", "ext4", "--minutes", "1.5", "--jobs", "1",
           "--json", str(out), check_rc=0, timeout=1800)
    b = json.loads(out.read_text())
    r = b["per_fs"]["ext4"]
    vm, fuse = r["vm"], r["fuse"]
    assert list(b["per_fs"]) == ["ext4"] and b["jobs"] == 1
    assert vm["workloads"] == fuse["workloads"] > 0 and vm["crash_states"] > 0 and fuse["crash_states"] > 0
    assert vm["one_time_s"]["boots_n"] >= 1 and vm["steady_s"] < vm["elapsed_s"]   # the boot is not in the rate
    assert fuse["one_time_s"]["boots"] == 0 and fuse["steady_s"] == fuse["elapsed_s"]
    assert r["vm_cost_over_fuse"] == pytest.approx(fuse["workloads_per_min"] / vm["workloads_per_min"], rel=0.02)
    prof = vm["state_profile"]
    assert prof["states"] >= vm["crash_states"] and prof["ms_per_state"]["guest"] > 0
    assert {"record", "recover"} <= set(vm["guest_job_s_per_workload"])
    assert pc.leftovers() == []
