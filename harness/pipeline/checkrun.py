"""One run's checking half as one object: what `_check`, `_check_log` (run.py) and
its report.json (`build_report`) read, instead of a dozen parameters each: the
recording, the workload and the options it ran under, the backend whose kernel
recovers, and which crash states to check."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any

from checkers.crashwalk.walk import Inspect
from checkers.findings import Finding
from foundation.filesystems import FsType
from foundation.runstate import RunState
from harness.backends import Backend
from harness.backends.recording import Recording
from harness.pipeline.config import RunConfig
from harness.reports.report import latency_clock
from replay.crashpoints import CrashPointSpec
from workloads.runner import WorkloadRunner


@dataclass
class CheckRun:
    rec: Recording
    workload: WorkloadRunner
    fs: FsType
    cfg: RunConfig
    mount_opts: str
    kinds: CrashPointSpec             # the crash point kinds checked
    backend: Backend                  # recovers the crash images
    backend_name: str                 # the backend that recorded (the report names it)
    state: RunState
    inspect_extra: Inspect | None = None  # also reads every recovered image (after the content oracle)
    state_ids: tuple[str, ...] = ()   # only these crash states (recheck)
    image: str | None = None          # check this image instead of the rebuilt state (recheck --image)


def build_report(run: CheckRun, *, log_entries: int, crash_points: int, states_checked: int,
                 findings: list[Finding], extra: dict[str, Any]) -> dict[str, Any]:
    """report.json of RUN: what was recorded and how, what was checked, what was found."""
    rec = run.rec
    report = {
        "powercut_report": 1,
        "fs": run.fs.name,
        "mkfs_opts": run.cfg.mkfs_opts,
        "mount_opts": run.mount_opts,
        "backend": run.backend_name,
        "kernel": rec.kernel,              # the kernel under test (a vm guest's, or the host's)
        "host_kernel": platform.release(),
        "workload": {"name": run.workload.name, **rec.workload},
        "log": os.path.basename(rec.log_path),
        "log_entries": log_entries,
        "device_bytes": rec.device_bytes,
        "sector_size": rec.sector_size,
        "crash_points": crash_points,
        "crash_states_checked": states_checked,
        "findings": [f.to_json() for f in findings],
    }
    report.update(extra)
    report["latency_clock"] = latency_clock(extra)
    return report
