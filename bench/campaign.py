"""The vm backend next to fuse the way campaigns run: `powercut fuzz` itself, both sides.

For each file system, `powercut fuzz --engine exhaustive --seq 1 --jobs 2
--seed 3` runs first through the vm backend for a few minutes, then through
the fuse backend with `--max-workloads` the number the vm campaign ran, so
both sides run the same workloads of the same space with the same engine and
the same workers; the file systems follow one another (btrfs, ext4, xfs), so
the pairs see the same load on a shared machine. Reported per campaign:

- steady rates: workloads per minute and crash states per second over the
  campaign's own clock (report.json elapsed_s) less the one-time costs: each
  worker's guest boots (report.json vm.boot_seconds, summed over workers, so
  divided by the workers, who boot side by side);
- one-time costs apart: the boots, and the time from the command's start to
  the campaign's clock (install, kernel and initramfs from the cache, worker
  start-up): the command's wall time less elapsed_s;
- where the guest workers' time went (vm.job_seconds, per workload) and
  where a guest crash state's time went (vm.state_profile: staging into the
  batch disk, the guest's recovery job, copy out, the host's fsck and content
  check, the wait for checks after the guest; per state and in all).

The guest's kernel coverage (POWERCUT_VM_COVERAGE=on; off by default, and the exhaustive
engine this bench runs does not ask for it) is part of what campaigns pay when on; `guest_coverage` says which way the bench ran.

`vm_cost_over_fuse_campaign` is the vm side's cost per workload over the
fuse side's, per file system and at most over all: issue 36's target is 3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from foundation import paths
from foundation.errors import EnvError
from harness.backends.vm import coverage

FILE_SYSTEMS = ("btrfs", "ext4", "xfs")
JOBS = 2
SEED = 3


def _fuzz(argv: list[str], out: str, log: str) -> tuple[dict[str, Any], float]:
    """One `powercut fuzz` session into OUT: its report.json and the command's wall seconds."""
    cmd = [sys.executable, "-m", "cli.main", "fuzz", *argv, "--out", out]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=paths.ROOT)
    wall = time.perf_counter() - t0
    report = os.path.join(out, "report.json")
    if p.returncode not in (0, 1) or not os.path.exists(report):
        with open(log) as f:
            tail = f.read()[-600:]
        raise EnvError(f"bench campaign: `{' '.join(cmd[2:])}` exited {p.returncode}: {tail.strip()}")
    with open(report) as f:
        return json.load(f), wall


def side(report: dict[str, Any], wall: float, jobs: int) -> dict[str, Any]:
    """A campaign's steady rates, its one-time costs, and its guests' costs per workload."""
    vm = report.get("vm") or {}
    guests = vm.get("guests", vm)   # (the campaign's summed guest stats)
    boot = float(guests.get("boot_seconds", 0.0))
    elapsed = float(report["elapsed_s"])
    steady = max(elapsed - boot / jobs, 1e-6)
    n, states = int(report["workloads"]), int(report["crash_states_checked"])
    out: dict[str, Any] = {
        "workloads": n, "crash_states": states, "elapsed_s": elapsed, "command_s": round(wall, 1),
        "one_time_s": {"boots": round(boot, 2), "boots_n": guests.get("boots", 0),
                       "before_campaign_clock": round(max(wall - elapsed, 0.0), 1)},
        "steady_s": round(steady, 1),
        "workloads_per_min": round(60 * n / steady, 2),
        "crash_states_per_s": round(states / steady, 2),
        "findings": len(report.get("saved_findings", [])),
    }
    if guests.get("job_seconds") and n:
        out["guest_job_s_per_workload"] = {k: round(v / n, 2) for k, v in guests["job_seconds"].items()}
    if vm.get("state_profile"):
        out["state_profile"] = vm["state_profile"]
    return out


def bench_campaign(kernel: str, scratch: str, minutes: float, file_systems: tuple[str, ...] = FILE_SYSTEMS,
                   jobs: int = JOBS) -> dict[str, Any]:
    common = ["--engine", "exhaustive", "--seq", "1", "--jobs", str(jobs), "--seed", str(SEED)]
    per_fs: dict[str, Any] = {}
    for fs in file_systems:
        d = os.path.join(scratch, f"campaign-{fs}")
        os.makedirs(d, exist_ok=True)
        load = os.getloadavg()[0]
        vm_report, vm_wall = _fuzz(["--fs", fs, *common, "--backend", "vm", "--kernel", kernel,
                                    "--duration", f"{int(minutes * 60)}s"], os.path.join(d, "vm"),
                                   os.path.join(d, "vm.log"))
        vm = side(vm_report, vm_wall, jobs)
        fuse_report, fuse_wall = _fuzz(["--fs", fs, *common, "--backend", "fuse", "--duration",
                                        f"{int(minutes * 60)}s", "--max-workloads", str(max(vm["workloads"], 1))],
                                       os.path.join(d, "fuse"), os.path.join(d, "fuse.log"))
        fuse = side(fuse_report, fuse_wall, jobs)
        cost = fuse["workloads_per_min"] / max(vm["workloads_per_min"], 1e-6)
        per_fs[fs] = {"vm": vm, "fuse": fuse, "vm_cost_over_fuse": round(cost, 2),
                      "vm_states_cost_over_fuse": round(fuse["crash_states_per_s"] / max(vm["crash_states_per_s"], 1e-6), 2),
                      "load_avg_1min": [round(load, 2), round(os.getloadavg()[0], 2)]}
    return {"kernel": kernel, "jobs": jobs, "minutes": minutes, "engine": "exhaustive --seq 1", "seed": SEED,
            "guest_coverage": coverage.enabled(),   # POWERCUT_VM_COVERAGE (BPF coverage in the guest's jobs)
            "vm_cost_over_fuse_campaign": {fs: r["vm_cost_over_fuse"] for fs, r in per_fs.items()},
            "vm_cost_over_fuse_campaign_max": max(r["vm_cost_over_fuse"] for r in per_fs.values()),
            "per_fs": per_fs}
