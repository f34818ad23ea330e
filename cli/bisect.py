"""`powercut bisect`: the first kernel where a workload's verdict changes (fuzz/bisect.py)."""

from __future__ import annotations

import argparse
import os
import time

from fuzz import bisect
from foundation.errors import UsageError
from harness.pipeline.config import RunConfig
from replay.crashpoints import DEFAULT as DEFAULT_POINTS
from replay.crashstates import DEFAULT_REORDER


def bisect_cmd(args: argparse.Namespace) -> int:
    if args.changed_against:
        return _bisect_changed(args)
    workload, cfg = _target(args)
    kernels = bisect.kernel_list(args.kernels)
    out = bisect.ensure_out(args.out or os.path.join("out", f"bisect-{time.strftime('%Y%m%d-%H%M%S')}"))
    report = bisect.Bisection(workload, cfg, kernels, out).run()
    path = bisect.write(out, report)
    print(bisect.summary(report))
    print(f"  report: {path}")
    return 1 if report["first_changed"] else 0


def _bisect_changed(args: argparse.Namespace) -> int:
    """Every corpus case whose verdict changed between two results files, bisected."""
    kernels = bisect.kernel_list(args.kernels)
    out = bisect.ensure_out(args.out or os.path.join("out", f"bisect-{time.strftime('%Y%m%d-%H%M%S')}"))
    found = 0
    for key, run_dir in bisect.changed_runs(args.target, args.changed_against):
        workload, cfg = bisect.from_run_dir(run_dir)
        case_out = bisect.ensure_out(os.path.join(out, key.replace("@", "-")))
        report = bisect.Bisection(workload, cfg, kernels, case_out).run()
        bisect.write(case_out, report)
        print(f"{key}:\n{bisect.summary(report)}")
        found += report["first_changed"] is not None
    return 1 if found else 0


def _target(args: argparse.Namespace) -> tuple[str, RunConfig]:
    if os.path.isfile(os.path.join(args.target, "finding.json")):
        workload, cfg = bisect.from_finding(args.target)
    elif os.path.isfile(os.path.join(args.target, "report.json")):
        workload, cfg = bisect.from_run_dir(args.target)
    elif os.path.isfile(args.target):
        if not args.fs:
            raise UsageError("--fs is required with a workload file (a finding directory brings its own)")
        workload = args.target
        cfg = RunConfig.parse({"fs": args.fs, "mkfs_opts": args.mkfs_opts, "mount_opts": args.mount_opts,
                               "crash_points": args.crash_points, "reorder": args.reorder})
    else:
        raise UsageError(f"{args.target}: no such workload file, finding or run directory")
    return workload, cfg


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bisect", help="find the first kernel where a workload's verdict changes (vm backend)",
                       description="Run WORKLOAD (every crash state, --backend vm) on kernels chosen by binary "
                                   "search and report the first kernel whose verdict differs from the first "
                                   "kernel's, with each tested kernel's verdict. Exit 0: same verdict at both "
                                   "ends, 1: a change was found, 2: error.")
    p.add_argument("target", metavar="WORKLOAD-OR-FINDING",
                   help="a workload file (.json or busybox .sh), a saved finding directory or a run directory "
                        "(their workload and configuration)")
    p.add_argument("--kernels", required=True, metavar="LIST",
                   help="debian:A..debian:B (every Debian package of that series between them), "
                        "SPEC,SPEC,... (in that order), or a directory of kernel directories")
    p.add_argument("--fs", help="ext4, xfs, btrfs or f2fs (with a workload file)")
    p.add_argument("--mkfs-opts", default="")
    p.add_argument("--mount-opts", default=None)
    p.add_argument("--crash-points", default=None, metavar="KINDS", help=f"(default: {DEFAULT_POINTS})")
    p.add_argument("--reorder", default=DEFAULT_REORDER, metavar="MODES")
    p.add_argument("--changed-against", metavar="RESULTS",
                   help="WORKLOAD-OR-FINDING is a corpus results.json: bisect every case whose verdict differs "
                        "from this other results.json (make ci-kernel)")
    p.add_argument("--out", default="", help="output directory (default: out/bisect-TIME): one run per kernel, "
                                             "bisect.json")
    p.set_defaults(func=bisect_cmd)
