"""`powercut export FINDING-DIR --format fstests|shell [--out DIR] [--check-vm KERNEL]
[--verify KERNEL[,FIXED] --fstests DIR]`."""

from __future__ import annotations

import argparse
import os

from harness.pipeline.run import terminate_as_exception
from harness.reports import export
from harness.reports.export import shell


def _cmd(args: argparse.Namespace) -> int:
    # SIGTERM as an exception: --verify and --check-vm boot a guest in its own session
    # (Ctrl-C at the terminal does not reach it), so only powercut's teardown stops it.
    with terminate_as_exception():
        return _export(args)


def _export(args: argparse.Namespace) -> int:
    if args.verify:  # a usage error before anything is written
        from harness.reports.export.verify import check_fstests_dir, parse_kernels
        parse_kernels(args.verify)
        args.fstests = check_fstests_dir(args.fstests or os.environ.get("POWERCUT_FSTESTS"))
    x = export.load(args.finding)
    for k in args.seen_on or []:
        if k not in x.kernels:
            x.kernels.append(k)
    if args.bisect:
        export.add_bisect(x, args.bisect)
    out = args.out or os.path.join(args.finding, f"export-{args.format}")
    for path in export.write(x, args.format, out):
        print(f"powercut export: wrote {path}")
    if args.verify:
        return _verify(x, args, out)
    if args.check_vm:
        from harness.reports.export import fstests
        from harness.reports.export.vmcheck import check_fstests_in_vm, check_in_vm
        if args.format == "shell":
            check = check_in_vm(x, shell.render(x), args.check_vm)
            says = {1: "REPRODUCED", 0: "not reproduced", 2: "could not run"}
        else:
            test, golden = fstests.render(x)
            check = check_fstests_in_vm(x, test, golden, args.check_vm)
            says = {1: "FAILED (the bug shows: output differs from the golden .out)", 0: "passed"}
        log = os.path.join(out, f"vm-check-{check.kernel or 'unknown'}.txt")
        with open(log, "w") as f:
            f.write(check.output)
        print(f"powercut export: on kernel {check.kernel} ({args.check_vm}) the {args.format} export: "
              f"{says.get(check.exit_code, '?')} (exit {check.exit_code}; output in {log})")
        return 1 if check.exit_code == 1 else (2 if check.exit_code == 2 else 0)
    return 0


def _verify(x: export.ExportInput, args: argparse.Namespace, out: str) -> int:
    """Exit 1 when the first kernel shows the bug in both exports and the fixed one (if given) in neither."""
    from harness.reports.export import fstests
    from harness.reports.export.verify import parse_kernels, verify_on
    kernels = parse_kernels(args.verify)
    checkout = args.fstests
    test, golden = fstests.render(x)
    script = shell.render(x)
    verdicts = []
    for k in kernels:
        v = verify_on(x, k, checkout, test, golden, script, out)
        verdicts.append(v)
        print(f"powercut export: on {v.uname or k} ({k}): fstests generic/{fstests.NUMBER} {v.fstests}, "
              f"shell export {v.shell} (output in {v.output})")
    bad = verdicts[0]
    if bad.fstests in ("error", "not run") or bad.shell == "could not run":
        print("powercut export: the exports could not run everywhere: see the outputs above")
        return 2
    shows = bad.fstests == "failed" and bad.shell == "REPRODUCED"
    fixed_ok = all(v.fstests == "passed" and v.shell == "not reproduced" for v in verdicts[1:])
    print(f"powercut export: {'verified' if shows and fixed_ok else 'NOT verified'}: the bug "
          f"{'shows' if shows else 'does not show'} on {kernels[0]}"
          + (f", {'and not' if fixed_ok else 'and also'} on {kernels[1]}" if len(kernels) > 1 else ""))
    return 1 if shows else 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("export", help="a saved finding as an fstests test or a standalone reproducer script")
    p.add_argument("finding", help="a saved finding directory (CAMPAIGN/findings/NNN-KIND)")
    p.add_argument("--format", choices=export.FORMATS, required=True)
    p.add_argument("--out", help="output directory (default FINDING/export-FORMAT)")
    p.add_argument("--seen-on", action="append", metavar="KERNEL", help="another kernel the finding was seen on")
    p.add_argument("--bisect", metavar="BISECT_JSON",
                   help="a `powercut bisect` report of this finding: its kernels go into the header (seen / not seen on)")
    p.add_argument("--check-vm", metavar="KERNEL",
                   help="run the export in the vm backend on KERNEL (debian:PACKAGE or a vmlinux; fstests: under a "
                        "stand-in for xfstests' helpers); exit 1 if the bug shows")
    p.add_argument("--verify", metavar="KERNEL[,FIXED]",
                   help="run the fstests export with a real fstests (./check, in a guest of KERNEL) and the shell "
                        "export; with FIXED also there: exit 1 if the bug shows on KERNEL")
    p.add_argument("--fstests", metavar="DIR",
                   help="a built fstests checkout for --verify (default: $POWERCUT_FSTESTS)")
    p.set_defaults(func=_cmd)
