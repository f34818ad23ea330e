"""One workload through the whole pipeline, as a library.

`run_workload` records a workload on a fresh file system and checks every
crash point (recovery mount, fsck, content oracle); `powercut run` is this
plus argument parsing and the summary, `powercut fuzz` calls it in-process
for every workload it generates. `recheck` runs only the checking half on a
saved run directory, for one crash point: the exact crash state a finding
came from, rebuilt from the saved log.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from checkers.crash_check import PointInspect, Progress, check_crash_points
from checkers.findings import Finding
from checkers.workload_checks import WorkloadChecks, finish, prepare, records_path
from harness import ownership, sysres
from harness.backends import backend_class
from harness.errors import UsageError
from harness.filesystems import FsType, get_fs
from harness.report import build_report
from harness.runstate import RunState
from harness.session import MARK_MKFS, Recording, record
from harness.sparse import sparse_copy
from harness.workload_runner import ExecutorWorkload, WorkloadRunner
from replay.crashpoints import DEFAULT as DEFAULT_POINTS, parse_spec, select_crash_points
from replay.logformat import LogReader
from replay.replayer import find_mark


class Terminated(BaseException):
    """SIGTERM, turned into an exception so every teardown path runs. A BaseException,
    like KeyboardInterrupt, so that nothing mistakes it for a failure of the work
    (Hypothesis would shrink it)."""


@contextmanager
def terminate_as_exception() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise Terminated()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@dataclass(frozen=True)
class RunConfig:
    """Everything about a run but the workload: the file system set-up and the crash walk."""

    fs: str
    mkfs_opts: str = ""
    mount_opts: str = ""
    backend: str = "fuse"
    size_mib: int = 0                  # 0: the file system's default
    crash_points: str = DEFAULT_POINTS
    fault: str | None = None           # test-only recorder fault (pc-recorder --fault)
    keep_image: bool = False

    def fs_type(self) -> FsType:
        """The file system, after checking the options that do not need a run (UsageError)."""
        fs = get_fs(self.fs)
        if self.size_mib and self.size_mib < fs.min_size_mib:
            raise UsageError(f"--size {self.size_mib} MiB is too small for {fs.name} (minimum {fs.min_size_mib} MiB)")
        parse_spec(self.crash_points)
        backend_class(self.backend)
        return fs

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class RunResult:
    report: dict[str, Any]
    findings: list[Finding]
    checks: WorkloadChecks
    log_path: str
    points: list[int]


def check_tools(fs: FsType) -> None:
    sysres.require_tools(fs.mkfs[0], fs.fsck[0], "mount", "umount", "losetup")


def keep_image(src: str, dst: str) -> None:
    fd = ownership.create_file(dst)
    try:
        sparse_copy(src, fd)
    finally:
        os.close(fd)


def run_workload(workload: WorkloadRunner, cfg: RunConfig, out_dir: str, *, progress: Progress | None = None,
                 inspect_extra: PointInspect | None = None) -> RunResult:
    """Record WORKLOAD on a fresh file system, check its crash points; OUT_DIR gets log, records and
    (written by the caller) the report. INSPECT_EXTRA also reads every recovered crash image."""
    fs = cfg.fs_type()
    check_tools(fs)
    device_cls = backend_class(cfg.backend)
    state = RunState.create(f"run {workload.name}")
    try:
        with terminate_as_exception():
            device = device_cls(state, (cfg.size_mib or fs.default_size_mib) << 20,
                                os.path.join(out_dir, "recording.log"), fault=cfg.fault)
            rec = record(device, fs, cfg.mkfs_opts, cfg.mount_opts, workload, state, out_dir)
            if cfg.keep_image and rec.final_image:
                keep_image(rec.final_image, os.path.join(out_dir, "final.img"))
            return _check(rec, workload, fs, cfg, state, None, progress, inspect_extra)
    finally:
        failed = state.teardown(log=lambda m: print(m, file=sys.stderr))
        if failed:
            print(f"powercut: {len(failed)} resource(s) left behind: run `powercut cleanup`", file=sys.stderr)


def _check(rec: Recording, workload: WorkloadRunner, fs: FsType, cfg: RunConfig, state: RunState,
           points: list[int] | None, progress: Progress | None, inspect_extra: PointInspect | None) -> RunResult:
    reader = LogReader(rec.log_path)
    if points is None:
        points = select_crash_points(reader.entries(), cfg.crash_points, first=find_mark(reader, MARK_MKFS))
    checks = WorkloadChecks()
    out_dir = os.path.dirname(rec.log_path)
    if isinstance(workload, ExecutorWorkload):
        checks = prepare(workload.workload, workload.plan, records_path(out_dir, rec.workload), reader, fs.name)
    inspect = _combine(checks.oracle.inspect if checks.oracle else None, inspect_extra)
    result = check_crash_points(rec.log_path, points, fs=fs, mount_opts=cfg.mount_opts,
                                device_bytes=rec.device_bytes, state=state, progress=progress, inspect=inspect)
    finish(checks)
    findings = checks.findings + result.findings
    report = build_report(fs=fs.name, mkfs_opts=cfg.mkfs_opts, mount_opts=cfg.mount_opts, backend=cfg.backend,
                          workload={"name": workload.name, **rec.workload}, log_path=rec.log_path,
                          log_entries=reader.nr_entries, device_bytes=rec.device_bytes,
                          sector_size=rec.sector_size, crash_points=len(points),
                          states_checked=result.states_checked, findings=findings, extra=checks.report)
    return RunResult(report, findings, checks, rec.log_path, points)


def _combine(a: PointInspect | None, b: PointInspect | None) -> PointInspect | None:
    if a is None or b is None:
        return a or b
    return lambda mnt, point: a(mnt, point) + b(mnt, point)


def recheck(run_dir: str, crash_point: int) -> RunResult:
    """Check one crash point of the run saved in RUN_DIR again, from its log (no new recording)."""
    try:
        with open(os.path.join(run_dir, "report.json")) as f:
            saved = json.load(f)
        info = saved["workload"]
        cfg = RunConfig(fs=saved["fs"], mkfs_opts=saved["mkfs_opts"], mount_opts=saved["mount_opts"],
                        backend=saved["backend"])
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise UsageError(f"{run_dir}: not a powercut run directory ({e})") from None
    if info.get("type") != "json":
        raise UsageError(f"{run_dir}: only runs of JSON workloads can be re-checked")
    # The workload travels with the run (findings directories are moved around).
    local = os.path.join(run_dir, os.path.basename(info["file"]))
    workload = ExecutorWorkload(local if os.path.exists(local) else info["file"])
    fs = cfg.fs_type()
    check_tools(fs)
    rec = Recording(os.path.join(run_dir, saved["log"]), saved["device_bytes"], saved["sector_size"], info)
    if not 0 <= crash_point < saved["log_entries"]:
        raise UsageError(f"--crash-point {crash_point}: the log has entries 0..{saved['log_entries'] - 1}")
    state = RunState.create(f"recheck {run_dir}")
    try:
        with terminate_as_exception():
            return _check(rec, workload, fs, cfg, state, [crash_point], None, None)
    finally:
        state.teardown(log=lambda m: print(m, file=sys.stderr))
