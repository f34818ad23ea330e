"""`powercut export FINDING-DIR --format fstests|shell [--out DIR] [--check-vm KERNEL]`."""

from __future__ import annotations

import argparse
import os

from harness.foundation.errors import UsageError
from harness.reports import export
from harness.reports.export import shell


def _cmd(args: argparse.Namespace) -> int:
    x = export.load(args.finding)
    for k in args.seen_on or []:
        if k not in x.kernels:
            x.kernels.append(k)
    if args.bisect:
        export.add_bisect(x, args.bisect)
    out = args.out or os.path.join(args.finding, f"export-{args.format}")
    for path in export.write(x, args.format, out):
        print(f"powercut export: wrote {path}")
    if args.check_vm:
        if args.format != "shell":
            raise UsageError("--check-vm runs the shell export: use it with --format shell")
        from harness.reports.export.vmcheck import check_in_vm
        check = check_in_vm(x, shell.render(x), args.check_vm)
        log = os.path.join(out, f"vm-check-{check.kernel or 'unknown'}.txt")
        with open(log, "w") as f:
            f.write(check.output)
        verdict = {1: "REPRODUCED", 0: "not reproduced", 2: "could not run"}.get(check.exit_code, "?")
        print(f"powercut export: on kernel {check.kernel} ({args.check_vm}) the shell export says: {verdict} "
              f"(exit {check.exit_code}; output in {log})")
        return 1 if check.exit_code == 1 else (2 if check.exit_code == 2 else 0)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("export", help="a saved finding as an fstests test or a standalone reproducer script")
    p.add_argument("finding", help="a saved finding directory (CAMPAIGN/findings/NNN-KIND)")
    p.add_argument("--format", choices=export.FORMATS, required=True)
    p.add_argument("--out", help="output directory (default FINDING/export-FORMAT)")
    p.add_argument("--seen-on", action="append", metavar="KERNEL", help="another kernel the finding was seen on")
    p.add_argument("--bisect", metavar="BISECT_JSON",
                   help="a `powercut bisect` report of this finding: its kernels go into the header (seen / not seen on)")
    p.add_argument("--check-vm", metavar="KERNEL",
                   help="run the shell export in the vm backend on KERNEL (debian:PACKAGE or a vmlinux); exit 1 if it reproduces")
    p.set_defaults(func=_cmd)
