"""`make ci-kernel` once, end to end, through the Makefile's own recipe: a corpus sample
on this host (fuse) and in a guest of a Debian kernel (vm), a short exhaustive campaign
in that guest, and `corpus diff` of the two results (the kernel-upgrade job of ci/).

Kept to its minimum (one corpus entry, one row, one campaign workload): each step
boots a TCG guest. The job's exit status for every combination of the steps' results
is in test_bisect.py (steps replaced by a script); this is the real thing once.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from common import KERNEL_612, ROOT, vm
from conftest import PcEnv

pytestmark = [*vm, pytest.mark.slow]


def test_make_ci_kernel_runs_every_step_on_a_real_kernel(pc: PcEnv) -> None:
    out = pc.tmp / "ci"
    p = subprocess.run(["make", "-s", "-C", str(ROOT), "ci-kernel", f"KERNEL={KERNEL_612}", f"OUT={out}",
                        "ENTRIES=append-fsync", "ROWS=ext4-ordered", "CI_FUZZ_WORKLOADS=1"],
                       capture_output=True, text=True, env=pc.env(), cwd=pc.tmp, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    host = json.loads((out / "host" / "results.json").read_text())
    kernel = json.loads((out / "kernel" / "results.json").read_text())
    assert set(host["cases"]) == set(kernel["cases"]) == {"append-fsync@ext4-ordered"}
    # the same verdict on both kernels, so the diff found nothing and nothing was bisected
    case = "append-fsync@ext4-ordered"
    assert host["cases"][case]["verdict"] == kernel["cases"][case]["verdict"]
    assert (out / "diff.rc").read_text().strip() == "0" and (out / "fuzz.rc").read_text().strip() == "0"
    assert (out / "diff.md").read_text().strip() and not (out / "bisect.rc").exists()
    # the campaign ran its workload in the guest kernel
    [camp] = out.glob("fuzz-*")
    report = json.loads((camp / "report.json").read_text())
    assert report["workloads"] == 1 and report["run"]["backend"] == "vm" and report["vm"]["boots"] >= 1
    assert pc.leftovers() == []
