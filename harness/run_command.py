"""`powercut run`: record a workload on a fresh file system and check every crash point."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from checkers import latency
from checkers.crash_check import check_crash_points
from checkers.findings import Finding
from harness import ownership, sysres
from harness.backends import BACKENDS, open_backend
from harness.errors import UsageError
from harness.filesystems import FsType, get_fs
from harness.progress import CrashProgress
from harness.report import build_report, summary, write_report
from harness.runstate import RunState
from harness.session import MARK_MKFS
from harness.sparse import sparse_copy
from harness.workload_runner import ExecutorWorkload, load_runner
from replay.crashpoints import DEFAULT as DEFAULT_POINTS, select_crash_points
from replay.logformat import LogReader
from replay.replayer import find_mark
from workloads.results import read_records


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


def run(args: argparse.Namespace) -> int:
    fs = get_fs(args.fs)
    size_mib = args.size or fs.default_size_mib
    if size_mib < fs.min_size_mib:
        raise UsageError(f"--size {size_mib} MiB is too small for {fs.name} (minimum {fs.min_size_mib} MiB)")
    workload = load_runner(args.workload)
    check_tools(fs)
    backend = open_backend(args.backend, fs, workload, fault=args.fault, kernel=args.kernel,
                           kernel_modules=args.kernel_modules)
    out_dir = ownership.make_dir(args.out or default_out_dir(workload.name, fs.name))
    log_path = os.path.join(out_dir, "recording.log")

    state = RunState.create(f"run {args.workload}")
    try:
        with terminate_as_exception():
            rec = backend.record(fs, args.mkfs_opts, args.mount_opts, workload, state, out_dir, size_mib << 20, log_path)
            if args.keep_image and rec.final_image:
                keep_image(rec.final_image, os.path.join(out_dir, "final.img"))
            reader = LogReader(rec.log_path)
            points = select_crash_points(reader.entries(), args.crash_points, first=find_mark(reader, MARK_MKFS))
            with CrashProgress(f"checking {fs.name}") as progress:
                result = check_crash_points(rec.log_path, points, fs=fs, mount_opts=args.mount_opts,
                                            device_bytes=rec.device_bytes, state=state, progress=progress,
                                            engine=backend.recovery(fs, args.mount_opts, state))
    finally:
        failed = state.teardown(log=lambda m: print(m, file=sys.stderr))
        if failed:
            print(f"powercut: {len(failed)} resource(s) left behind: run `powercut cleanup`", file=sys.stderr)

    extra: dict[str, Any] = backend.report_extra()
    findings = list(result.findings)
    if isinstance(workload, ExecutorWorkload):
        results = read_records(os.path.join(out_dir, rec.workload["records"]), workload.plan)
        extra["latency"] = latency.summarize(results, workload.workload)
        findings += [Finding("latency", f["detail"], evidence={k: v for k, v in f.items() if k not in ("kind", "detail")})
                     for f in latency.findings(extra["latency"], workload.workload)]
    report = build_report(fs=fs.name, mkfs_opts=args.mkfs_opts, mount_opts=args.mount_opts, backend=args.backend,
                          kernel=rec.kernel,
                          workload={"name": workload.name, **rec.workload}, log_path=rec.log_path,
                          log_entries=reader.nr_entries, device_bytes=rec.device_bytes,
                          sector_size=rec.sector_size, crash_points=len(points),
                          states_checked=result.states_checked, findings=findings, extra=extra)
    path = write_report(out_dir, report)
    print(summary(report, path))
    return 1 if findings else 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="record a workload and check every crash point",
                       description="Record WORKLOAD on a fresh file system and check every crash point. "
                                   "Exit 0: nothing found, 1: findings, 2: usage or environment error.")
    p.add_argument("workload", help="a workload: a powercut-workload/1 .json file (run by the timing executor), "
                                    "or an executable, .sh or .py program run in the mounted directory")
    p.add_argument("--fs", required=True, help="ext4, xfs or btrfs")
    p.add_argument("--backend", default="fuse",
                   help=f"recorded-device backend: {', '.join(BACKENDS)} (default: fuse)")
    p.add_argument("--kernel", default=None, metavar="debian:PACKAGE|PATH",
                   help="--backend vm: the kernel under test, a Debian kernel package "
                        "(e.g. debian:linux-image-6.12-amd64) or a vmlinux/bzImage file")
    p.add_argument("--kernel-modules", default=None, metavar="DIR",
                   help="--backend vm with --kernel PATH: its lib/modules/VERSION directory (with modules.dep)")
    p.add_argument("--mkfs-opts", default="", help="extra mkfs options, e.g. \"-O ^has_journal\"")
    p.add_argument("--mount-opts", default="", help="mount options, e.g. data=writeback,barrier=0")
    p.add_argument("--size", type=int, default=0, help="device size in MiB (default: per file system)")
    p.add_argument("--out", default="", help="output directory (default: out/NAME-FS-TIME)")
    p.add_argument("--crash-points", default=DEFAULT_POINTS, metavar="KINDS",
                   help="where to crash: comma-separated flush, fua, mark, write, or N for every Nth entry "
                        f"(default: {DEFAULT_POINTS}; the end of the log always)")
    p.add_argument("--keep-image", action="store_true",
                   help="save the device's final image as OUT/final.img (sparse)")
    p.add_argument("--fault", choices=["drop-flush"], default=None,
                   help="test-only: make the recorder lie (drop-flush: flushes are acknowledged but not logged)")
    p.set_defaults(func=run)
