"""Fuzzing the kernel under test: `powercut fuzz --backend vm` with one live guest per worker.

TCG boots and guest jobs cost seconds each, so there are three campaigns,
each asserting several things: a planted violation (the kernel's flushes
left out of its log) is found, shrunk and reproduced by reproduce.sh in a
guest booting the same kernel; a guest kernel that crashes (sysrq, the
recovery-panic test fault) during a recovery mount gives a `kernel` finding
with the console excerpt while the campaign goes on in a fresh guest; and a
recovery mount stuck on I/O (recovery-hang) is caught by the hang watchdog.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from common import newest, vm
from test_campaign_report import check_page
from conftest import PcEnv

pytestmark = [
    *vm,
]

KERNEL = "debian:linux-image-6.12-amd64"
VM = ["--fs", "ext4", "--backend", "vm", "--kernel", KERNEL, "--engine", "exhaustive", "--seq", "1"]


def campaign(pc: PcEnv, *args: str, rc: int, env: dict[str, str] | None = None) -> tuple[dict, str]:
    out = pc.tmp / "campaign"
    p = pc.run("fuzz", "--out", str(out), *VM, *args, timeout=1500, env=env)
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
    # Recorded by the guest kernel in its live guest: one boot for the whole campaign, and one
    # more after each job the guest was lost in (an image made with flushes dropped may crash it).
    run = json.loads(open(os.path.join(d, "run", "report.json")).read())
    assert run["backend"] == "vm" and run["kernel"].startswith("6.12") and run["vm"]["live_guest"]
    assert report["vm"]["boots"] <= 1 + report["vm"]["lost"] and "record" in report["vm"]["job_seconds"]
    # Where the workers' guest crash states went, summed over the campaign: every state the
    # guest recovered was staged and fsck'ed on the host.
    prof = report["vm"]["state_profile"]
    assert 0 < prof["states"] and prof["seconds"]["guest"] > 0 and prof["ms_per_state"]["fsck"] > 0
    # reproduce.sh boots the same kernel to recover that crash state and shows the finding again.
    script = open(os.path.join(d, "reproduce.sh")).read()
    assert f"--backend vm --kernel {KERNEL}" in script
    p = subprocess.run([os.path.join(d, "reproduce.sh")], capture_output=True, text=True, env=pc.env(), timeout=900)
    assert p.returncode == 1 and f"[{f['kind']}]" in p.stdout, p.stdout + p.stderr
    assert pc.leftovers() == []
    check_page(Path(out), report)
    assert report["latency_clock"] == "emulated"


def test_documented_bug_saved_unshrunk(pc: PcEnv) -> None:
    """Debian's 6.12.117 btrfs has generic/764's bug (docs/bugs/): the ordered space meets it
    within its first few dozen workloads. The campaign names it, saves it as found (no shrink
    run) and report.md says so; its latencies are the emulator's and report.json says that."""
    out = pc.tmp / "c"
    p = pc.run("fuzz", "--out", str(out), "--fs", "btrfs", "--backend", "vm", "--kernel",
               "debian:linux-image-6.12.117+deb12-amd64", "--engine", "exhaustive", "--seq", "2", "--jobs", "1",
               "--max-findings", "1", "--max-workloads", "60", "--duration", "20m", timeout=1800)
    assert p.returncode == 1, p.stdout + p.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["shrink_runs"] == 0 and report["latency_clock"] == "emulated"
    (s,) = report["saved_findings"]
    f = json.loads((out / "findings" / s["dir"] / "finding.json").read_text())
    assert f["triage"]["verdict"] == "documented" and f["shrink"]["known_bug"] == f["triage"]["bug"], f["triage"]
    assert report["known_bug_hits"][f["triage"]["bug"]] >= 1
    assert f"triage: documented kernel bug {f['triage']['bug']}" in p.stdout
    md = check_page(out, report)
    assert "Measured in an emulated guest" in md
    assert pc.leftovers() == []


def test_guest_panic_in_a_recovery_mount_is_a_kernel_finding_and_the_campaign_goes_on(pc: PcEnv) -> None:
    report, out = campaign(pc, "--fault", "recovery-panic", "--max-workloads", "2", "--shrink-seconds", "1",
                           "--duration", "20m", rc=1)
    assert report["workloads"] >= 2 and report["harness_errors"] == 0 and report["failed_workers"] == []
    assert report["findings_by_kind"].get("kernel", 0) >= 2      # every workload's first recovery mount
    # Each crash took its guest down; the worker booted a new one and went on.
    assert report["vm"]["boots"] >= 3 and report["vm"]["lost"] >= 2 and report["vm"]["boots"] <= 1 + report["vm"]["lost"]
    saved = [s for s in report["saved_findings"] if s["kind"] == "kernel"]
    assert saved and saved[0]["signature"].startswith("kernel|")
    assert saved[0]["signature"].endswith("|recovery mount:sysrq-crash")
    f = json.loads(open(os.path.join(out, "findings", saved[0]["dir"], "finding.json")).read())
    assert f["evidence"]["phase"] == "recovery mount"
    assert "sysrq: Trigger a crash" in f["evidence"]["console"] and "Kernel panic" in f["evidence"]["console"]
    assert pc.leftovers() == []


def test_a_recovery_mount_stuck_in_the_kernel_is_a_hang_finding(pc: PcEnv) -> None:
    """The live guest's watchdog: the recovery-hang fault suspends the device-mapper device under
    the first recovery mount, so the guest kernel waits for I/O that never completes and the
    guest goes silent; past the hang limit the worker kills it and reports a `kernel` hang."""
    report, out = campaign(pc, "--fault", "recovery-hang", "--max-workloads", "1", "--shrink-seconds", "0",
                           "--duration", "20m", rc=1, env=pc.env(POWERCUT_VM_HANG_S="15"))
    assert report["harness_errors"] == 0 and report["failed_workers"] == []
    saved = [s for s in report["saved_findings"] if s["kind"] == "kernel"]
    assert saved and saved[0]["signature"].endswith("|recovery mount:hang"), report["saved_findings"]
    f = json.loads(open(os.path.join(out, "findings", saved[0]["dir"], "finding.json")).read())
    assert f["evidence"]["phase"] == "recovery mount" and f["evidence"]["event"] == "hang"
    assert "pc: mount 0" in f["evidence"]["console"]  # the console shows which mount it was
    assert pc.leftovers() == []


def bisect_inode_cache(pc: PcEnv, kernels: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """btrfs' deprecated `inode_cache` mount option is accepted (and ignored) by 6.1 and
    refused by 6.12, so the same workload is clean on a 6.1 kernel and cannot run on 6.12
    (which fails fast: its mount is refused before any crash state)."""
    from workloads import exhaustive
    w = pc.tmp / "w.json"
    w.write_text(json.dumps(exhaustive.workload(1, 0)))
    out = pc.tmp / "bisect"
    # Few crash states (marks only, in order): the bisection is about kernels, not states.
    # --mkfs-opts: btrfs' default node size, given, so every kernel's run must carry it.
    p = pc.run("bisect", str(w), "--fs", "btrfs", "--mkfs-opts", "-n 16384", "--mount-opts", "inode_cache",
               "--crash-points", "mark", "--reorder", "none", "--kernels", kernels, "--out", str(out), timeout=1800)
    report = json.loads((out / "bisect.json").read_text())
    assert report["run"]["mkfs_opts"] == "-n 16384", report["run"]
    return p, report


def test_bisect_searches_a_directory_of_three_real_kernels(pc: PcEnv) -> None:
    """Three Debian kernels unpacked side by side (6.1.0-K, 6.12.A, 6.12.B): the ends differ, so
    the search step runs the middle kernel, and the change is placed at it (without the search
    step it would be placed at the last one)."""
    from harness.backends.vm.kernel import resolve
    kdir = pc.tmp / "kernels"
    kdir.mkdir()
    for name in (*newest("6.1", 1), *newest("6.12", 2)):
        k = resolve("debian:" + name)                      # downloads into the kernel cache once
        release = os.path.basename(k.modules)             # e.g. 6.1.0-56-amd64, 6.12.117+deb12-amd64
        (kdir / release).symlink_to(os.path.dirname(k.image))
    p, r = bisect_inode_cache(pc, str(kdir))
    assert p.returncode == 1, p.stdout + p.stderr
    order = sorted(os.listdir(kdir), key=lambda n: [int(t) for t in re.findall(r"\d+", n)[:3]])
    verdicts = {os.path.basename(os.path.dirname(t["kernel"])): t["verdict"] for t in r["tested"]}
    assert sorted(verdicts) == sorted(order), verdicts                      # all three ran
    assert verdicts[order[0]] == "clean", verdicts
    assert all(verdicts[k].startswith("error: ") and "mount failed" in verdicts[k] for k in order[1:]), verdicts
    first = r["first_changed"]
    assert os.path.basename(os.path.dirname(first["kernel"])) == order[1]   # the search step's kernel
    assert os.path.basename(os.path.dirname(first["previous"])) == order[0]
    assert "first kernel with a changed verdict:" in p.stdout
    assert pc.leftovers() == []


def test_bisect_over_a_debian_range_with_one_verdict_runs_its_two_ends(pc: PcEnv) -> None:
    """debian:A..debian:B: every package of the series between them; the same verdict at both
    ends is exit 0 after two kernels (two 6.12 kernels: both refuse the mount, fast)."""
    old, new = newest("6.12", 2)
    p, r = bisect_inode_cache(pc, f"debian:{old}..debian:{new}")
    assert p.returncode == 0, p.stdout + p.stderr
    assert r["first_changed"] is None
    assert r["kernels"][0] == f"debian:{old}" and r["kernels"][-1] == f"debian:{new}"
    assert [t["kernel"] for t in r["tested"]] == [f"debian:{old}", f"debian:{new}"]
    a, b = (t["verdict"] for t in r["tested"])
    assert a == b and a.startswith("error: ") and "mount failed" in a, (a, b)
    assert pc.leftovers() == []
