"""What a campaign workload costs in the vm backend next to the fuse backend.

The workloads are the ones `powercut fuzz --engine exhaustive --seq 1` runs
(14-15 ops: setup, sync, the op, its persistence op), N of them spread evenly
over the seq-1 space so that every kind of op counts, not only the first
ones; on btrfs by default (the file system of issue 24's measurement: fuse
90.2 workloads/min, vm 11.0, both with --jobs 2). Each runs the way a campaign
worker runs it (fuzz/trial.py run_doc): once through a live guest (--backend vm,
one boot for all) and once through the fuse backend on the host kernel,
alternately, workload by workload, so that both sides see the same load on a
shared machine. Reported per side: workloads per minute and crash states per
second for one worker, the guest's boot excluded from the vm rates (a worker
boots once per campaign) and reported on its own; `vm_cost_over_fuse`, how
many times a workload costs more in the guest (issue 24's target: at most 3);
and where the vm worker's time went: boot, record job (mount, workload,
umount in the guest), recover job (recovery mounts in the guest, with the
host's fsck and content checks of the images already recovered running
alongside) and the host's share outside the guest's jobs.
"""

from __future__ import annotations

import os
import time
from typing import Any

from fuzz.trial import run_doc
from harness.backends.vm.backend import LiveVm
from harness.pipeline.live import live_guest
from harness.pipeline.config import RunConfig
from workloads import exhaustive

FS = "btrfs"


def campaign_docs(n: int) -> list[dict[str, Any]]:
    """N seq-1 workloads spread evenly over the whole seq-1 space."""
    space = exhaustive.space_size(1)
    return [exhaustive.workload(1, (k * space) // n) for k in range(min(n, space))]


class _Side:
    def __init__(self) -> None:
        self.seconds, self.states, self.findings, self.workloads = 0.0, 0, 0, 0

    def run(self, doc: dict[str, Any], cfg: RunConfig, work: str, live: LiveVm | None) -> None:
        t0 = time.perf_counter()
        trial = run_doc(doc, cfg, work, opener=live.open if live else None)
        self.seconds += time.perf_counter() - t0
        self.states += trial.result.report["crash_states_checked"]
        self.findings += len(trial.findings)
        self.workloads += 1

    def result(self) -> dict[str, Any]:
        s = max(self.seconds, 1e-6)
        return {"workloads_per_min": round(60 * self.workloads / s, 2), "crash_states_per_s": round(self.states / s, 2),
                "workloads": self.workloads, "seconds": round(self.seconds, 2), "crash_states": self.states,
                "findings": self.findings}


def bench_vm(kernel: str, scratch: str, n: int, fs_name: str = FS) -> dict[str, Any]:
    docs = campaign_docs(n)
    fuse_cfg = RunConfig.parse({"fs": fs_name, "quiet": True})
    vm_cfg = RunConfig.parse({"fs": fs_name, "backend": "vm", "kernel": kernel, "quiet": True})
    fuse, vm = _Side(), _Side()
    with live_guest(vm_cfg.backend, [fs_name]) as live:
        assert live is not None
        for i, doc in enumerate(docs):
            vm.run(doc, vm_cfg, os.path.join(scratch, "vm", f"w{i}"), live)
            fuse.run(doc, fuse_cfg, os.path.join(scratch, "fuse", f"w{i}"), None)
        stats = live.stats()
    boot = stats["boot_seconds"]
    vm.seconds -= boot  # inside the first workload's time; once per worker, not per workload
    jobs = stats["job_seconds"]
    v, f = vm.result(), fuse.result()
    ratio = v["workloads_per_min"] / max(f["workloads_per_min"], 1e-6)
    return {
        "kernel": kernel, "fs": fs_name, "workloads": len(docs), "names": [d["name"] for d in docs],
        "vm": v, "fuse": f,
        "vm_over_fuse_workloads_ratio": round(ratio, 3),
        "vm_cost_over_fuse": round(1 / max(ratio, 1e-6), 2),
        "vm_over_fuse_states_ratio": round(v["crash_states_per_s"] / max(f["crash_states_per_s"], 1e-6), 3),
        "cost_per_workload_s": {"boot_once": boot, "boots": stats["boots"],
                                **{f"guest_{k}": round(s / len(docs), 2) for k, s in jobs.items()},
                                "host": round((vm.seconds - sum(jobs.values())) / len(docs), 2)},
    }
