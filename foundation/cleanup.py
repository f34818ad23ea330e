"""`powercut cleanup`: tear down what killed runs left behind.

Only runs recorded in powercut's own state directory are considered, and
only those whose owning process is gone; each resource is released only if
it is still the one that run created (see runstate.py).
"""

from __future__ import annotations

import sys

from foundation import runstate


def cleanup_dead_runs(verbose: bool = True, owners: set[int] | None = None) -> tuple[int, list[str]]:
    """Tear down the runs whose owning process is gone (with OWNERS: only those these pids owned)."""
    cleaned, failed = 0, []
    for run in runstate.all_runs():
        if run.owner_alive() or (owners is not None and run.owner_pid() not in owners):
            continue
        live = run.live_resources()
        errs = run.teardown(log=lambda m: print(m, file=sys.stderr))
        if verbose and live:
            print(f"run {run.run_id}: released {len(live) - len(errs)} of {len(live)} resources")
        cleaned += 1
        failed += errs
    return cleaned, failed
