"""The exhaustive engine: every workload of the bounded ACE-style space
(workloads/exhaustive.py), in index order.

Worker n of j takes the indices i with i % j == n (and, with --shard K/N,
i % N == K, for splitting one space across machines); indices already in the
journal are skipped, so --resume continues where the campaign stopped.
Findings are shrunk by delta debugging (fuzz/minimize.py).
"""

from __future__ import annotations

from fuzz.worker import Worker
from workloads import exhaustive


def indices(w: Worker, number: int | None = None, jobs: int | None = None) -> list[int]:
    """The indices worker NUMBER (default the worker's own) of JOBS (default all workers)
    runs, in order, without those already journaled."""
    seq, cap, names = w.options["seq"], w.options["seq_cap"], w.options.get("core_ops")
    shard, shards = w.options.get("shard", (0, 1))
    number, jobs = w.number if number is None else number, w.jobs if jobs is None else jobs
    done = w.campaign.totals().indices
    mine = [i for k, i in enumerate(exhaustive.capped(seq, cap, names)) if k % jobs == number]
    return [i for i in mine if i % shards == shard and i not in done]


def run(w: Worker) -> None:
    run_indices(w, indices(w))


def run_indices(w: Worker, todo: list[int]) -> None:
    failed = [i for i in todo if not w.should_stop() and not run_index(w, i)]
    # A harness error (the environment, not the workload) would leave a hole in a
    # space reported as covered: each such index gets one more try at the end.
    for i in failed:
        if not w.should_stop():
            run_index(w, i)


def run_index(w: Worker, i: int) -> bool:
    """Run and triage workload I; False if the harness failed on it (journaled as an error)."""
    trial = w.run(exhaustive.workload(w.options["seq"], i, w.options.get("core_ops")), engine="exhaustive", index=i)
    if trial is not None:
        w.triage(trial)
    return trial is not None
