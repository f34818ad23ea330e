"""`powercut cleanup`: tear down what killed runs left behind (see foundation/cleanup.py)."""

from __future__ import annotations

import argparse

from foundation.cleanup import cleanup_dead_runs


def _cmd(args: argparse.Namespace) -> int:
    cleaned, failed = cleanup_dead_runs()
    print(f"powercut cleanup: {cleaned} dead run(s) cleaned" + (f", {len(failed)} resource(s) could not be released" if failed else ""))
    return 2 if failed else 0  # nothing is found here: a resource left behind is the environment's trouble


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("cleanup", help="remove loop devices, mounts and daemons left by killed runs")
    p.set_defaults(func=_cmd)
