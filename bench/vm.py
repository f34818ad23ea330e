"""How fast a campaign worker fuzzes the kernel under test: the vm backend next to fuse.

The same seq-1 workloads (the exhaustive engine's first N) run back to back
the way a campaign worker runs them (fuzz/trial.py run_doc): once through a
live guest (--backend vm, one boot for all of them) and once through the
fuse backend on the host kernel, in the same process and the same minute,
so the ratio holds on a busy machine. Reported per side: workloads per
minute and crash states per second, the guest's boot excluded from the
vm rates (a worker boots once per campaign) and reported on its own; and
where the vm worker's time went: boot, record job (mount, workload, umount
in the guest), recover job (recovery mounts in the guest), the host-made
file system, and the host's share (replay, fsck, oracle, report).
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


def _run_all(docs: list[dict[str, Any]], cfg: RunConfig, scratch: str, live: LiveVm | None) -> dict[str, Any]:
    states, findings = 0, 0
    t0 = time.perf_counter()
    for i, doc in enumerate(docs):
        trial = run_doc(doc, cfg, os.path.join(scratch, f"w{i}"), opener=live.open if live else None)
        states += trial.result.report["crash_states_checked"]
        findings += len(trial.findings)
    return {"workloads": len(docs), "seconds": round(time.perf_counter() - t0, 2), "crash_states": states,
            "findings": findings}


def _rates(r: dict[str, Any], exclude_s: float = 0.0) -> dict[str, float]:
    seconds = max(r["seconds"] - exclude_s, 1e-6)
    return {"workloads_per_min": round(60 * r["workloads"] / seconds, 2),
            "crash_states_per_s": round(r["crash_states"] / seconds, 2)}


def bench_vm(kernel: str, scratch: str, n: int, fs_name: str = "ext4") -> dict[str, Any]:
    docs = [exhaustive.workload(1, i) for i in range(n)]
    fuse = _run_all(docs, RunConfig.parse({"fs": fs_name, "quiet": True}), os.path.join(scratch, "fuse"), None)
    vm_cfg = RunConfig.parse({"fs": fs_name, "backend": "vm", "kernel": kernel, "quiet": True})
    with live_guest(vm_cfg.backend, [fs_name]) as live:
        assert live is not None
        vm = _run_all(docs, vm_cfg, os.path.join(scratch, "vm"), live)
        stats = live.stats()
    boot = stats["boot_seconds"]
    jobs = stats["job_seconds"]
    guest_s = sum(jobs.values())
    vm_rates, fuse_rates = _rates(vm, boot), _rates(fuse)
    per = {k: round(v / n, 2) for k, v in jobs.items()}
    return {
        "kernel": kernel, "fs": fs_name, "workloads": n,
        "vm": {**vm_rates, **vm}, "fuse": {**fuse_rates, **fuse},
        "vm_over_fuse_workloads_ratio": round(vm_rates["workloads_per_min"] / fuse_rates["workloads_per_min"], 3),
        "vm_over_fuse_states_ratio": round(vm_rates["crash_states_per_s"] / max(fuse_rates["crash_states_per_s"], 1e-6), 3),
        "cost_per_workload_s": {"boot_once": boot, "boots": stats["boots"], **{f"guest_{k}": v for k, v in per.items()},
                                "host": round((vm["seconds"] - boot - guest_s) / n, 2)},
    }
