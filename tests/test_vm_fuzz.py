"""Fuzzing the kernel under test: `powercut fuzz --backend vm` with one live guest per worker.

TCG boots and guest jobs cost seconds each, so there are two campaigns, each
asserting several things: a planted violation (the kernel's flushes left
out of its log) is found, shrunk and reproduced by reproduce.sh in a guest
booting the same kernel; and a guest kernel that crashes (sysrq, the
recovery-panic test fault) during a recovery mount gives a `kernel` finding
with the console excerpt while the campaign goes on in a fresh guest.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import PcEnv

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (apt-get, kernel cache, scratch dirs)"),
]

KERNEL = "debian:linux-image-6.12-amd64"
VM = ["--fs", "ext4", "--backend", "vm", "--kernel", KERNEL, "--engine", "exhaustive", "--seq", "1"]


def campaign(pc: PcEnv, *args: str, rc: int) -> tuple[dict, str]:
    out = pc.tmp / "campaign"
    p = pc.run("fuzz", "--out", str(out), *VM, *args, timeout=1500)
    assert p.returncode == rc, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return json.loads((out / "report.json").read_text()), str(out)


def test_planted_violation_in_the_kernel_log_is_found_shrunk_and_reproduced(pc: PcEnv) -> None:
    report, out = campaign(pc, "--fault", "drop-flush", "--reorder", "drop-one", "--max-findings", "1",
                           "--shrink-seconds", "120", "--duration", "20m", rc=1)
    saved = report["saved_findings"]
    assert saved and report["harness_errors"] == 0
    d = os.path.join(out, "findings", saved[0]["dir"])
    f = json.loads(open(os.path.join(d, "finding.json")).read())
    assert f["kind"] in ("durability", "fsck", "mount", "atomicity", "stale-data")
    assert f["shrink"]["method"] == "delta debugging" and f["ops"] <= f["shrink"]["ops_before"]
    # Recorded by the guest kernel in its live guest: one boot for the whole campaign.
    run = json.loads(open(os.path.join(d, "run", "report.json")).read())
    assert run["backend"] == "vm" and run["kernel"].startswith("6.12") and run["vm"]["live_guest"]
    assert report["vm"]["boots"] == 1 and report["vm"]["job_seconds"]["record"] > 0
    # reproduce.sh boots the same kernel to recover that crash state and shows the finding again.
    script = open(os.path.join(d, "reproduce.sh")).read()
    assert f"--backend vm --kernel {KERNEL}" in script
    p = subprocess.run([os.path.join(d, "reproduce.sh")], capture_output=True, text=True, env=pc.env(), timeout=900)
    assert p.returncode == 1 and f"[{f['kind']}]" in p.stdout, p.stdout + p.stderr
    assert pc.leftovers() == []


def test_guest_panic_in_a_recovery_mount_is_a_kernel_finding_and_the_campaign_goes_on(pc: PcEnv) -> None:
    report, out = campaign(pc, "--fault", "recovery-panic", "--max-workloads", "2", "--shrink-seconds", "1",
                           "--duration", "20m", rc=1)
    assert report["workloads"] >= 2 and report["harness_errors"] == 0 and report["failed_workers"] == []
    assert report["findings_by_kind"].get("kernel", 0) >= 2      # every workload's first recovery mount
    # Each crash took its guest down; the worker booted a new one and went on.
    assert report["vm"]["boots"] >= 3
    saved = [s for s in report["saved_findings"] if s["kind"] == "kernel"]
    assert saved and saved[0]["signature"].startswith("kernel|")
    assert saved[0]["signature"].endswith("|recovery mount:sysrq-crash")
    f = json.loads(open(os.path.join(out, "findings", saved[0]["dir"], "finding.json")).read())
    assert f["evidence"]["phase"] == "recovery mount"
    assert "sysrq: Trigger a crash" in f["evidence"]["console"] and "Kernel panic" in f["evidence"]["console"]
    assert pc.leftovers() == []
