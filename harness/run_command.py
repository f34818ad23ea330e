"""`powercut run`: record a workload on a fresh file system and check every crash point."""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

from checkers.crash_check import check_crash_states, default_jobs
from harness import ownership, sysres
from harness.backends import backend_class
from harness.errors import Terminated, UsageError
from harness.filesystems import FsType, get_fs
from harness.progress import CrashProgress
from harness.report import build_report, summary, write_report
from harness.runstate import RunState
from harness.session import record
from harness.sparse import sparse_copy
from harness.workload_runner import ExternalProgram, WorkloadRunner
from replay.crashpoints import DEFAULT as DEFAULT_POINTS, mark_range, parse_spec, select_crash_points
from replay.crashstates import DEFAULT_PER_POINT, DEFAULT_REORDER, ReorderSpec
from replay.logformat import LogReader


@contextmanager
def terminate_as_exception() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise Terminated("terminated")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def load_workload(path: str) -> WorkloadRunner:
    return ExternalProgram(path)


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
    workload = load_workload(args.workload)
    # Check the crash-walk options before the (long) recording.
    parse_spec(args.crash_points)
    reorder = ReorderSpec.parse(args.reorder, args.states_per_point)
    if args.jobs < 0:
        raise UsageError(f"--jobs {args.jobs}: must be at least 1 (0: one per CPU)")
    check_tools(fs)
    device_cls = backend_class(args.backend)
    out_dir = ownership.make_dir(args.out or default_out_dir(workload.name, fs.name))
    log_path = os.path.join(out_dir, "recording.log")

    state = RunState.create(f"run {args.workload}")
    try:
        with terminate_as_exception():
            device = device_cls(state, size_mib << 20, log_path, fault=args.fault)
            rec = record(device, fs, args.mkfs_opts, args.mount_opts, workload, state, out_dir)
            if args.keep_image and rec.final_image:
                keep_image(rec.final_image, os.path.join(out_dir, "final.img"))
            reader = LogReader(rec.log_path)
            first, last = mark_range(reader, args.start_mark, args.end_mark)
            points = select_crash_points(reader.entries(), args.crash_points, first=first, last=last)
            with CrashProgress(f"checking {fs.name}") as progress:
                result = check_crash_states(rec.log_path, points, fs=fs, mount_opts=args.mount_opts,
                                            device_bytes=rec.device_bytes, state=state, reorder=reorder,
                                            jobs=args.jobs, first_failure=args.first_failure, progress=progress)
    finally:
        state.teardown_or_warn()

    report = build_report(fs=fs.name, mkfs_opts=args.mkfs_opts, mount_opts=args.mount_opts, backend=args.backend,
                          workload={"name": workload.name, **rec.workload}, log_path=rec.log_path,
                          log_entries=reader.nr_entries, device_bytes=rec.device_bytes,
                          sector_size=rec.sector_size, crash_points=len(points),
                          states_checked=result.states_checked, findings=result.findings,
                          extra={"reorder": args.reorder, "crash_states_total": result.states_total,
                                 "crash_states_duplicate": result.states_duplicate,
                                 "stopped_at_first_failure": result.stopped_early})
    path = write_report(out_dir, report)
    print(summary(report, path))
    return 1 if result.findings else 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="record a workload and check every crash point",
                       description="Record WORKLOAD on a fresh file system and check every crash point. "
                                   "Exit 0: nothing found, 1: findings, 2: usage or environment error.")
    p.add_argument("workload", help="a workload: an executable, .sh or .py program run in the mounted directory")
    p.add_argument("--fs", required=True, help="ext4, xfs or btrfs")
    p.add_argument("--backend", default="fuse", help="recorded-device backend (default: fuse)")
    p.add_argument("--mkfs-opts", default="", help="extra mkfs options, e.g. \"-O ^has_journal\"")
    p.add_argument("--mount-opts", default="", help="mount options, e.g. data=writeback,barrier=0")
    p.add_argument("--size", type=int, default=0, help="device size in MiB (default: per file system)")
    p.add_argument("--out", default="", help="output directory (default: out/NAME-FS-TIME)")
    p.add_argument("--crash-points", default=DEFAULT_POINTS, metavar="KINDS",
                   help="where to crash: comma-separated flush, fua, mark, write, or N for every Nth entry "
                        f"(default: {DEFAULT_POINTS}; the end of the log always)")
    p.add_argument("--start-mark", metavar="MARK", help="crash points start at the first mark MARK")
    p.add_argument("--end-mark", metavar="MARK", help="crash points end at the first mark MARK after the start")
    p.add_argument("--reorder", default=DEFAULT_REORDER, metavar="MODES",
                   help="crash states per crash point besides the in-order prefix, comma-separated: none, "
                        "drop-one (each write of the epoch dropped), torn[:512|:4096] (one write torn), "
                        f"sample:N (N random subsets), exhaustive:K (all subsets of epochs <= K writes) "
                        f"(default: {DEFAULT_REORDER})")
    p.add_argument("--states-per-point", type=int, default=DEFAULT_PER_POINT, metavar="N",
                   help=f"at most N states per reorder mode and crash point, a seeded sample beyond "
                        f"(default: {DEFAULT_PER_POINT})")
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help=f"crash states checked in parallel (default: one per CPU, here {default_jobs()})")
    p.add_argument("--first-failure", action="store_true", help="stop checking at the first finding")
    p.add_argument("--keep-image", action="store_true",
                   help="save the device's final image as OUT/final.img (sparse)")
    p.add_argument("--fault", choices=["drop-flush"], default=None,
                   help="test-only: make the recorder lie (drop-flush: flushes are acknowledged but not logged)")
    p.set_defaults(func=run)
