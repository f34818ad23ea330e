"""`powercut cleanup`: tear down what killed runs left behind.

Only runs recorded in powercut's own state directory are considered, and
only those whose owning process is gone; each resource is released only if
it is still the one that run created (see runstate.py).
"""

from __future__ import annotations

import argparse
import sys

from harness import runstate


def cleanup_dead_runs(verbose: bool = True) -> tuple[int, list[str]]:
    cleaned, failed = 0, []
    for run in runstate.all_runs():
        if run.owner_alive():
            continue
        live = run.live_resources()
        errs = run.teardown(log=lambda m: print(m, file=sys.stderr))
        if verbose and live:
            print(f"run {run.run_id}: released {len(live) - len(errs)} of {len(live)} resources")
        cleaned += 1
        failed += errs
    return cleaned, failed


def _cmd(args: argparse.Namespace) -> int:
    cleaned, failed = cleanup_dead_runs()
    print(f"powercut cleanup: {cleaned} dead run(s) cleaned" + (f", {len(failed)} resource(s) could not be released" if failed else ""))
    return 1 if failed else 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("cleanup", help="remove loop devices, mounts and daemons left by killed runs")
    p.set_defaults(func=_cmd)
