"""One run: record a workload on a fresh file system, check every crash point, report.

`run_one` is the whole pipeline behind `powercut run`; a matrix of runs
(harness/compare.py) calls it once per variant.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from checkers.crash_check import check_crash_points
from harness import ownership, sysres
from harness.analysis import analyze_run
from harness.backends import backend_class
from harness.errors import UsageError
from harness.filesystems import FsType, get_fs
from harness.progress import CrashProgress
from harness.report import build_report, summary, write_report
from harness.report_md import write_markdown
from harness.runstate import RunState
from harness.session import MARK_MKFS, record
from harness.sparse import sparse_copy
from harness.workload_runner import ExecutorWorkload, WorkloadRunner
from replay.crashpoints import DEFAULT as DEFAULT_POINTS, parse_spec, select_crash_points
from replay.logformat import LogReader
from replay.replayer import find_mark


class Terminated(Exception):
    """SIGTERM, turned into an exception so every teardown path runs."""


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


def default_out_dir(name: str, fs: str) -> str:
    return os.path.join("out", f"{name}-{fs}-{time.strftime('%Y%m%d-%H%M%S')}")


@dataclass(frozen=True)
class RunOptions:
    """`powercut run`'s options; None: the workload's default (a scenario's), else powercut's."""

    fs: FsType
    backend: str = "fuse"
    mkfs_opts: str = ""
    mount_opts: str | None = None
    crash_points: str | None = None
    size_mib: int = 0
    keep_image: bool = False
    fault: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunOptions:
        return cls(get_fs(args.fs), args.backend, args.mkfs_opts, args.mount_opts, args.crash_points, args.size,
                   args.keep_image, args.fault)


def run_one(workload: WorkloadRunner, opts: RunOptions, out: str) -> dict[str, Any]:
    """Record WORKLOAD on a fresh file system, check every crash point, write OUT/report.json and
    OUT/report.md, print the summary and return the report."""
    fs = opts.fs
    size_mib = opts.size_mib or max(fs.default_size_mib, workload.device.size_mib or 0)
    if size_mib < fs.min_size_mib:
        raise UsageError(f"--size {size_mib} MiB is too small for {fs.name} (minimum {fs.min_size_mib} MiB)")
    mount_opts = opts.mount_opts if opts.mount_opts is not None else workload.run_defaults.get("mount_opts", "")
    kinds = opts.crash_points or workload.run_defaults.get("crash_points", DEFAULT_POINTS)
    parse_spec(kinds)  # a bad spec fails before anything is recorded
    check_tools(fs)
    device_cls = backend_class(opts.backend)
    out_dir = ownership.make_dir(out)
    log_path = os.path.join(out_dir, "recording.log")

    state = RunState.create(f"run {workload.name}")
    try:
        with terminate_as_exception():
            device = device_cls(state, size_mib << 20, log_path, fault=opts.fault)
            rec = record(device, fs, opts.mkfs_opts, mount_opts, workload, state, out_dir)
            if opts.keep_image and rec.final_image:
                keep_image(rec.final_image, os.path.join(out_dir, "final.img"))
            reader = LogReader(rec.log_path)
            points = select_crash_points(reader.entries(), kinds, first=find_mark(reader, MARK_MKFS))
            with CrashProgress(f"checking {fs.name}") as progress:
                result = check_crash_points(rec.log_path, points, fs=fs, mount_opts=mount_opts,
                                            device_bytes=rec.device_bytes, state=state, progress=progress)
    finally:
        failed = state.teardown(log=lambda m: print(m, file=sys.stderr))
        if failed:
            print(f"powercut: {len(failed)} resource(s) left behind: run `powercut cleanup`", file=sys.stderr)

    extra: dict[str, Any] = {"crash_point_kinds": kinds, "device_tuning": rec.device_tuning}
    findings = list(result.findings)
    if isinstance(workload, ExecutorWorkload):
        facts = {"sysctls": rec.workload.get("sysctls", {}), "device_tuning": rec.device_tuning}
        sections, latency_findings = analyze_run(workload.workload, workload.plan, out_dir, rec.workload["records"],
                                                 facts)
        extra.update(sections)
        findings += latency_findings
    report = build_report(fs=fs.name, mkfs_opts=opts.mkfs_opts, mount_opts=mount_opts, backend=opts.backend,
                          workload={"name": workload.name, **rec.workload}, log_path=rec.log_path,
                          log_entries=reader.nr_entries, device_bytes=rec.device_bytes,
                          sector_size=rec.sector_size, crash_points=len(points),
                          states_checked=result.states_checked, findings=findings, extra=extra)
    path = write_report(out_dir, report)
    md = write_markdown(out_dir, report)
    print(summary(report, path) + f"\n  markdown: {md}")
    return report
