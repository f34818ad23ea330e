"""`powercut bench`: speed figures as JSON (see bench/run.py)."""

from __future__ import annotations

import argparse
import json
import os
import time

from bench import ttf
from bench.campaign import FILE_SYSTEMS, bench_campaign
from bench.run import bench, owned_file
from foundation.errors import UsageError
from foundation.runstate import RunState
from harness.pipeline.run import terminate_as_exception


def _cmd(args: argparse.Namespace) -> int:
    with terminate_as_exception():
        if args.only == "time-to-find":
            out = args.out or os.path.join("out", f"time-to-find-{time.strftime('%Y%m%d-%H%M%S')}")
            result = ttf.time_to_find(out, args.minutes or 15, args.jobs, args.bugs, args.table or ttf.TABLE)
        elif args.only == "campaign":
            result = _campaign(args)
        else:
            result = bench(args.quick, args.kernel or None, args.only, args.backend)
    text = json.dumps(result, indent=2) + "\n"
    if args.json:
        with owned_file(args.json, 0) as fd:
            os.write(fd, text.encode())
    print(ttf.summary(result) if args.only == "time-to-find" else text.rstrip("\n"))
    return 0


def _campaign(args: argparse.Namespace) -> dict:
    if not args.kernel:
        raise UsageError("bench --only campaign needs --kernel debian:PACKAGE|PATH")
    state = RunState.create("bench campaign")
    try:
        fss = tuple(f for f in args.fs.split(",") if f) or FILE_SYSTEMS
        return bench_campaign(args.kernel, state.scratch, args.minutes or 3, fss, jobs=args.jobs)
    finally:
        state.teardown_or_warn()


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bench", help="measure crash states/s, the mount+fsck floor, recorder overhead")
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    p.add_argument("--kernel", metavar="debian:PACKAGE|PATH",
                   help="also measure fuzzing through the vm backend on this kernel, next to fuse")
    p.add_argument("--only", choices=["all", "walk", "oracle", "recorder", "vm", "campaign", "time-to-find"], default="all",
                   help="walk: only the crash walk on ext4 and xfs next to its floors; "
                        "vm: only the vm backend next to fuse on campaign workloads (needs --kernel); "
                        "campaign: `powercut fuzz --engine exhaustive --seq 1` on vm then fuse, the same "
                        "workloads, --jobs workers, --minutes each, on btrfs, ext4 and xfs (needs --kernel; "
                        "not part of all; bench/campaign.py); "
                        "oracle: only the content oracle's cost per state across recorder scales; "
                        "recorder: only the recorder's fsync overhead over a plain loop device; "
                        "time-to-find: minutes a default vm campaign needs to find each known kernel bug of "
                        "bench/bugpairs.json (not part of all; docs/time-to-find.md)")
    p.add_argument("--backend", choices=["fuse", "dm"], default="fuse",
                   help="with --only recorder: whose recorder to measure (dm: this kernel's dm-log-writes; "
                        "with --kernel, where this kernel has none, that kernel's in a guest)")
    g = p.add_argument_group("--only time-to-find, --only campaign")
    g.add_argument("--minutes", type=float, default=0,
                   help="campaign budget per bug (default 15); with campaign: per vm campaign (default 3)")
    g.add_argument("--jobs", type=int, default=2, help="campaign workers (vm guests) per campaign (default 2)")
    g.add_argument("--fs", default="", metavar="FS,...",
                   help=f"with campaign: these file systems (default {','.join(FILE_SYSTEMS)})")
    g.add_argument("--bugs", default="", metavar="IDS", help="only these bugs of the table, comma-separated")
    g.add_argument("--table", default="", metavar="FILE", help="another bug table (default bench/bugpairs.json)")
    g.add_argument("--out", default="", help="campaigns and re-checks (default out/time-to-find-TIME)")
    p.add_argument("--quick", action="store_true", help="one repetition of each measurement (for tests)")
    p.set_defaults(func=_cmd)
