"""The run pipeline as a library: record a workload on a fresh file system,
check every crash point, build the report. `powercut run`, fuzz campaigns and
the corpus runner all call `run_workload` (the report) or `run_checked` (the
report and what it was built from: findings, the oracle's model, the crash
points). `recheck` runs only the checking half on a saved run directory, for
one crash point: the exact crash state a finding came from, rebuilt from the
saved log."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from checkers.crash_check import PointInspect, check_crash_points
from checkers.findings import Finding
from checkers.workload_checks import WorkloadChecks, finish, prepare, records_path
from harness import ownership, sysres
from harness.backends import Backend, open_backend
from harness.errors import UsageError
from harness.filesystems import FsType, get_fs
from harness.progress import CrashProgress
from harness.report import build_report, write_report
from harness.runstate import RunState
from harness.session import MARK_MKFS, Recording
from harness.sparse import sparse_copy
from harness.workload_runner import ExecutorWorkload, WorkloadRunner, load_runner
from replay.crashpoints import DEFAULT as DEFAULT_POINTS, parse_spec, select_crash_points
from replay.logformat import LogReader
from replay.replayer import find_mark


@dataclass
class RunConfig:
    fs: str
    backend: str = "fuse"
    mkfs_opts: str = ""
    mount_opts: str = ""
    size_mib: int = 0               # 0: the file system's default
    crash_points: str = DEFAULT_POINTS
    fault: str | None = None        # test-only recorder fault mode
    keep_image: bool = False
    kernel: str | None = None       # --backend vm: debian:PACKAGE or a kernel image path
    kernel_modules: str | None = None
    quiet: bool = False             # no crash-walk progress (campaigns print their own)

    def fs_type(self) -> FsType:
        """The file system, after checking the options that need no run (UsageError)."""
        fs = get_fs(self.fs)
        size_mib = self.size_mib or fs.default_size_mib
        if size_mib < fs.min_size_mib:
            raise UsageError(f"--size {size_mib} MiB is too small for {fs.name} (minimum {fs.min_size_mib} MiB)")
        parse_spec(self.crash_points)
        return fs

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class RunResult:
    report: dict[str, Any]
    findings: list[Finding]
    checks: WorkloadChecks          # the oracle (and its model of the workload) for JSON workloads
    log_path: str
    points: list[int]               # the crash points checked


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


def keep_image(src: str, dst: str) -> None:
    fd = ownership.create_file(dst)
    try:
        sparse_copy(src, fd)
    finally:
        os.close(fd)


def check_tools(fs: FsType) -> None:
    sysres.require_tools(fs.mkfs[0], fs.fsck[0], "mount", "umount", "losetup")


def run_workload(workload: WorkloadRunner | str, cfg: RunConfig, out_dir: str) -> dict[str, Any]:
    """Record WORKLOAD under CFG into OUT_DIR (created, or reused if powercut made
    it), check every crash point, write OUT_DIR/report.json; return the report
    (with `report_path`). Everything the run created is torn down, whatever happens."""
    return run_checked(workload, cfg, out_dir).report


def run_checked(workload: WorkloadRunner | str, cfg: RunConfig, out_dir: str,
                inspect_extra: PointInspect | None = None) -> RunResult:
    """run_workload, returning what the report was built from too. INSPECT_EXTRA
    also reads every recovered crash image (after the content oracle)."""
    fs = cfg.fs_type()
    if isinstance(workload, str):
        workload = load_runner(workload)
    check_tools(fs)
    backend = open_backend(cfg.backend, fs, workload, fault=cfg.fault, kernel=cfg.kernel,
                           kernel_modules=cfg.kernel_modules)
    out_dir = ownership.make_dir(out_dir)
    log_path = os.path.join(out_dir, "recording.log")

    state = RunState.create(f"run {workload.name}")
    try:
        with terminate_as_exception():
            rec = backend.record(fs, cfg.mkfs_opts, cfg.mount_opts, workload, state, out_dir,
                                 (cfg.size_mib or fs.default_size_mib) << 20, log_path)
            if cfg.keep_image and rec.final_image:
                keep_image(rec.final_image, os.path.join(out_dir, "final.img"))
            result = _check(rec, workload, fs, cfg, backend, state, None, inspect_extra)
    finally:
        failed = state.teardown(log=lambda m: print(m, file=sys.stderr))
        if failed:
            print(f"powercut: {len(failed)} resource(s) left behind: run `powercut cleanup`", file=sys.stderr)
    result.report["report_path"] = write_report(out_dir, result.report)
    return result


def _check(rec: Recording, workload: WorkloadRunner, fs: FsType, cfg: RunConfig, backend: Backend,
           state: RunState, points: list[int] | None, inspect_extra: PointInspect | None) -> RunResult:
    reader = LogReader(rec.log_path)
    if points is None:
        points = select_crash_points(reader.entries(), cfg.crash_points, first=find_mark(reader, MARK_MKFS))
    checks = WorkloadChecks()
    if isinstance(workload, ExecutorWorkload):
        checks = prepare(workload.workload, workload.plan, records_path(os.path.dirname(rec.log_path), rec.workload),
                         reader, fs.name)
    inspect = _combine(checks.oracle.inspect if checks.oracle else None, inspect_extra)
    with (nullcontext() if cfg.quiet else CrashProgress(f"checking {fs.name}")) as progress:
        result = check_crash_points(rec.log_path, points, fs=fs, mount_opts=cfg.mount_opts,
                                    device_bytes=rec.device_bytes, state=state, progress=progress, inspect=inspect,
                                    engine=backend.recovery(fs, cfg.mount_opts, state))
    finish(checks)
    findings = checks.findings + result.findings
    report = build_report(fs=fs.name, mkfs_opts=cfg.mkfs_opts, mount_opts=cfg.mount_opts, backend=cfg.backend,
                          kernel=rec.kernel, workload={"name": workload.name, **rec.workload}, log_path=rec.log_path,
                          log_entries=reader.nr_entries, device_bytes=rec.device_bytes,
                          sector_size=rec.sector_size, crash_points=len(points),
                          states_checked=result.states_checked, findings=findings,
                          extra={**checks.report, **backend.report_extra()})
    return RunResult(report, findings, checks, rec.log_path, points)


def _combine(a: PointInspect | None, b: PointInspect | None) -> PointInspect | None:
    if a is None or b is None:
        return a or b
    return lambda mnt, point: a(mnt, point) + b(mnt, point)


def recheck(run_dir: str, crash_point: int) -> RunResult:
    """Check one crash point of the run saved in RUN_DIR again, from its log (no new
    recording), recovered by this host's kernel."""
    try:
        with open(os.path.join(run_dir, "report.json")) as f:
            saved = json.load(f)
        info = saved["workload"]
        cfg = RunConfig(fs=saved["fs"], mkfs_opts=saved["mkfs_opts"], mount_opts=saved["mount_opts"], quiet=True)
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise UsageError(f"{run_dir}: not a powercut run directory ({e})") from None
    if info.get("type") != "json":
        raise UsageError(f"{run_dir}: only runs of JSON workloads can be re-checked")
    # The workload travels with the run (findings directories are moved around).
    local = os.path.join(run_dir, os.path.basename(info["file"]))
    workload = ExecutorWorkload(local if os.path.exists(local) else info["file"])
    fs = cfg.fs_type()
    check_tools(fs)
    rec = Recording(os.path.join(run_dir, saved["log"]), saved["device_bytes"], saved["sector_size"], info,
                    kernel=saved["kernel"])
    if not 0 <= crash_point < saved["log_entries"]:
        raise UsageError(f"--crash-point {crash_point}: the log has entries 0..{saved['log_entries'] - 1}")
    backend = open_backend(cfg.backend, fs, workload)
    state = RunState.create(f"recheck {run_dir}")
    try:
        with terminate_as_exception():
            return _check(rec, workload, fs, cfg, backend, state, [crash_point], None)
    finally:
        state.teardown(log=lambda m: print(m, file=sys.stderr))
