"""`powercut bench`: speed figures as JSON (see bench/run.py)."""

from __future__ import annotations

import argparse
import json
import os

from bench.run import bench, owned_file
from harness.pipeline.run import terminate_as_exception


def _cmd(args: argparse.Namespace) -> int:
    with terminate_as_exception():
        result = bench(args.quick, args.kernel or None, args.only, args.backend)
    text = json.dumps(result, indent=2) + "\n"
    if args.json:
        with owned_file(args.json, 0) as fd:
            os.write(fd, text.encode())
    print(text, end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bench", help="measure crash states/s, the mount+fsck floor, recorder overhead")
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    p.add_argument("--kernel", metavar="debian:PACKAGE|PATH",
                   help="also measure fuzzing through the vm backend on this kernel, next to fuse")
    p.add_argument("--only", choices=["all", "walk", "oracle", "recorder", "vm"], default="all",
                   help="walk: only the crash walk on ext4 and xfs next to its floors; "
                        "vm: only the vm backend next to fuse on campaign workloads (needs --kernel); "
                        "oracle: only the content oracle's cost per state across recorder scales; "
                        "recorder: only the recorder's fsync overhead over a plain loop device")
    p.add_argument("--backend", choices=["fuse", "dm"], default="fuse",
                   help="with --only recorder: whose recorder to measure (dm: this kernel's dm-log-writes)")
    p.add_argument("--quick", action="store_true", help="one repetition of each measurement (for tests)")
    p.set_defaults(func=_cmd)
