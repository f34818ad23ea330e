"""`powercut run`: record a workload on a fresh file system and check every crash point."""

from __future__ import annotations

import argparse

from checkers.crashwalk.walk import default_walk_workers
from checkers.crashwalk.recovery_modes import CHOICES
from harness.pipeline.compare import run_matrix
from harness.pipeline.run import default_out_dir, recheck, run_workload
from harness.reports.report import summary
from cli.options import add_backend_options, add_known_damage_option, add_semantics_option, run_config
from workloads.runner import load_runner
from replay.crashpoints import DEFAULT as DEFAULT_POINTS, DEFAULT_BUDGET, EVERY_POINT
from replay.crashstates import DEFAULT_PER_POINT, DEFAULT_REORDER


def add_recovery_args(p: argparse.ArgumentParser, crash: bool = True) -> None:
    """--recovery (and --recovery-crash with its budget): shared by run, fuzz, corpus run, recheck."""
    p.add_argument("--recovery", default=None, metavar="|".join(CHOICES),
                   help="how each crash image is recovered: rw (a read-write mount, the default), ro (a read-only "
                        "mount: the kernel still replays its journal/log), both (each crash state both ways)")
    if not crash:
        return
    p.add_argument("--recovery-crash", action="store_true",
                   help="also cut the power during recovery: record each recovery mount, recover again from "
                        "crash states inside it, check them against the original crash point (fuse backend)")
    p.add_argument("--recovery-crash-states", type=int, default=8, metavar="N",
                   help="--recovery-crash: at most N crash states inside each recovery (a seeded sample; default 8)")
    p.add_argument("--recovery-crash-rate", type=float, default=1.0, metavar="F",
                   help="--recovery-crash: the fraction of crash states whose recovery is recorded, chosen by "
                        "state id (default 1: all)")


def run(args: argparse.Namespace) -> int:
    cfg = run_config(args, fs=args.fs, mkfs_opts=args.mkfs_opts, mount_opts=args.mount_opts, size_mib=args.size,
                     crash_points=args.crash_points, start_mark=args.start_mark, end_mark=args.end_mark,
                     reorder=args.reorder, states_per_point=args.states_per_point, jobs=args.jobs,
                     first_failure=args.first_failure, keep_image=args.keep_image, markdown=True,
                     max_states=args.max_states, calibrate=True, semantics=args.semantics,
                     known_damage_findings=args.known_damage_findings)
    if args.mount_opts_matrix or args.param_matrix:
        return run_matrix(args.workload, cfg, args.scale, args.param, args.out,
                          mount_opts_matrix=args.mount_opts_matrix, param_matrix=args.param_matrix)
    workload = load_runner(args.workload, args.scale, args.param)
    report = run_workload(workload, cfg, args.out or default_out_dir(workload.name, args.fs))
    print(summary(report, report["report_path"]))
    return 1 if report["findings"] else 0


def recheck_cmd(args: argparse.Namespace) -> int:
    result = recheck(args.run_dir, args.state, args.recovery, args.semantics, args.image)
    print(summary(result.report, None))
    return 1 if result.findings else 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="record a workload and check every crash point",
                       description="Record WORKLOAD on a fresh file system and check every crash point. "
                                   "Exit 0: nothing found, 1: findings, 2: usage or environment error, 3: internal error.")
    p.add_argument("workload", help="a workload: a powercut-workload/1 .json file or scenario:NAME (run by the "
                                    "timing executor), or an executable, .sh or .py program run in the mounted directory")
    p.add_argument("--fs", required=True, help="ext4, xfs, btrfs or f2fs")
    add_backend_options(p, scopes=("test", "one-run"))
    p.add_argument("--mkfs-opts", default="", help="extra mkfs options, e.g. \"-O ^has_journal\"")
    add_semantics_option(p)
    add_known_damage_option(p)
    p.add_argument("--mount-opts", default=None,
                   help="mount options, e.g. data=writeback,barrier=0 (default: none, or the scenario's)")
    p.add_argument("--size", type=int, default=0,
                   help="device size in MiB (default: per file system, or more if the workload asks)")
    p.add_argument("--out", default="", help="output directory (default: out/NAME-FS-TIME)")
    p.add_argument("--crash-points", default=None, metavar="KINDS",
                   help="where to crash: comma-separated flush, fua, mark, write, or N for every Nth entry "
                        f"(default: {DEFAULT_POINTS}, or the scenario's; the end of the log always)")
    p.add_argument("--max-states", default=DEFAULT_BUDGET, metavar="N|design+N|all",
                   help="crash-point budget: N checks at most N crash points spread evenly over the log, plus the "
                        "design points (at and just before every fsync, sync_file_range, ftruncate, rename, open and "
                        f"close); design+N every design point plus N others spread evenly; {EVERY_POINT} every point "
                        f"(default {DEFAULT_BUDGET}: small runs check every point; the report says which fraction "
                        "was checked)")
    p.add_argument("--start-mark", metavar="MARK", help="crash points start at the first mark MARK")
    p.add_argument("--end-mark", metavar="MARK", help="crash points end at the first mark MARK after the start")
    p.add_argument("--reorder", default=DEFAULT_REORDER, metavar="MODES",
                   help="crash states per crash point besides the in-order prefix, comma-separated: none, "
                        "drop-one (each write of the epoch dropped), torn[:512|:4096] (one write torn), "
                        "sample:N (N random subsets), exhaustive:K (all subsets of epochs <= K writes) "
                        f"(default: {DEFAULT_REORDER})")
    p.add_argument("--states-per-point", type=int, default=DEFAULT_PER_POINT, metavar="N",
                   help=f"at most N states per reorder mode and crash point, a seeded sample beyond "
                        f"(default: {DEFAULT_PER_POINT})")
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help=f"crash states checked in parallel (default: one per CPU plus one, here {default_walk_workers()})")
    p.add_argument("--first-failure", action="store_true", help="stop checking at the first finding")
    p.add_argument("--keep-image", action="store_true",
                   help="save the device's final image as OUT/final.img (sparse)")
    add_recovery_args(p)
    p.add_argument("--scale", type=float, default=None,
                   help="scenario:NAME only: size of the experiment, 1.0 = the paper's counts (default 1.0)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="scenario:NAME only: set a scenario parameter (`powercut scenario list` shows them)")
    matrix = p.add_mutually_exclusive_group()
    matrix.add_argument("--mount-opts-matrix", default="", metavar="\"OPTS;OPTS;...\"",
                        help="run once per ';'-separated mount option set and compare them in one report")
    matrix.add_argument("--param-matrix", default="", metavar="\"KEY=V1;V2;...\"",
                        help="scenario:NAME only: run once per value of scenario parameter KEY and compare them")
    p.set_defaults(func=run)

    r = sub.add_parser("recheck", help="check one crash state of a saved run again, from its log",
                       description="Rebuild crash state ID of the run saved in RUN_DIR from its log, let this "
                                   "host's kernel (for a --backend vm run: a guest booting the same kernel) recover it, fsck it and run the content oracle: the exact crash "
                                   "state a finding came from. Exit 0: clean, 1: findings, 2: error, 3: internal error.")
    r.add_argument("run_dir", help="a `powercut run` output directory (report.json, recording.log, records)")
    r.add_argument("--state", required=True, metavar="ID",
                   help="crash state id from the report, e.g. p57 (in-order prefix), p57-d33 (a write dropped) "
                        "or p57/r12 (a crash inside the recovery of p57)")
    r.add_argument("--image", metavar="IMG",
                   help="check this image (e.g. a board's disk after a real power cut) against the guarantees "
                        "of crash state ID instead of rebuilding it from the log; only a copy is mounted")
    add_semantics_option(r, default=None)
    add_recovery_args(r, crash=False)
    r.set_defaults(func=recheck_cmd)
