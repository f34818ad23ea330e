"""`powercut run`: record a workload on a fresh file system and check every crash point."""

from __future__ import annotations

import argparse
import os
import time

from harness.backends import BACKENDS
from harness.pipeline import RunConfig, recheck, run_workload
from harness.report import summary
from harness.workload_runner import load_runner
from replay.crashpoints import DEFAULT as DEFAULT_POINTS


def default_out_dir(name: str, fs: str) -> str:
    return os.path.join("out", f"{name}-{fs}-{time.strftime('%Y%m%d-%H%M%S')}")


def run(args: argparse.Namespace) -> int:
    cfg = RunConfig(fs=args.fs, backend=args.backend, mkfs_opts=args.mkfs_opts, mount_opts=args.mount_opts,
                    size_mib=args.size, crash_points=args.crash_points, fault=args.fault, keep_image=args.keep_image,
                    kernel=args.kernel, kernel_modules=args.kernel_modules)
    workload = load_runner(args.workload)
    report = run_workload(workload, cfg, args.out or default_out_dir(workload.name, args.fs))
    print(summary(report, report["report_path"]))
    return 1 if report["findings"] else 0


def recheck_cmd(args: argparse.Namespace) -> int:
    result = recheck(args.run_dir, args.crash_point)
    print(summary(result.report, None))
    return 1 if result.findings else 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="record a workload and check every crash point",
                       description="Record WORKLOAD on a fresh file system and check every crash point. "
                                   "Exit 0: nothing found, 1: findings, 2: usage or environment error.")
    p.add_argument("workload", help="a workload: a powercut-workload/1 .json file (run by the timing executor), "
                                    "or an executable, .sh or .py program run in the mounted directory")
    p.add_argument("--fs", required=True, help="ext4, xfs or btrfs")
    p.add_argument("--backend", default="fuse", help=f"recorded-device backend: {', '.join(BACKENDS)} (default: fuse)")
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

    r = sub.add_parser("recheck", help="check one crash point of a saved run again, from its log",
                       description="Rebuild crash point N of the run saved in RUN_DIR from its log, let the "
                                   "kernel recover it, fsck it and run the content oracle: the exact crash state "
                                   "a finding came from. Exit 0: clean, 1: findings, 2: error.")
    r.add_argument("run_dir", help="a `powercut run` output directory (report.json, recording.log, records)")
    r.add_argument("--crash-point", type=int, required=True, metavar="N", help="log entry index of the crash point")
    r.set_defaults(func=recheck_cmd)
