"""The exhaustive engine: every workload of the bounded ACE-style space
(workloads/exhaustive.py), in index order.

Worker n of j takes the indices i with i % j == n (and, with --shard K/N,
i % N == K, for splitting one space across machines); indices already in the
journal are skipped, so --resume continues where the campaign stopped.
Findings are shrunk by delta debugging (fuzz/minimize.py).

In a joined campaign (--coordinator) nothing is split up front: each worker
claims the next position of the space from Redis (fuzz/coordinator.py),
runs and triages it, then completes it; a position whose machine died is
claimed again by a live one. When every position is handed out, a worker
waits for the last leases to end (done, or taken over) before it stops.
"""

from __future__ import annotations

import re
from typing import Any

from foundation.errors import UsageError
from foundation.options import Option
from fuzz.coordinator import ALL_DONE, WAIT
from fuzz.engine import FuzzEngine, OptionGroup, register_engine
from fuzz.worker import Worker
from workloads import exhaustive

WAIT_S = 1.0    # between claims while the last positions are leased to others
MAX_TRIES = 2   # harness failures of one position before it is given up (left out of the space done)
SEQ3_CAP = 20000  # --seq 3 without --seq-cap: the first N of its ordered space


def parse_seq(given: int | None) -> int:
    seq = 1 if given is None else given
    if seq not in (1, 2, 3):
        raise UsageError(f"--seq {seq}: 1, 2 or 3")
    return seq


def parse_core_ops(text: str | None) -> list[str] | None:
    core = text.split(",") if text else None
    unknown = sorted(set(core or []) - set(exhaustive.CORE_NAMES))
    if unknown:
        raise UsageError(f"--core-ops: unknown {', '.join(unknown)}; choose from {', '.join(exhaustive.CORE_NAMES)}")
    return core


def parse_shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    if m is None or not 0 <= int(m[1]) < int(m[2]):
        raise UsageError(f"--shard {text!r}: use K/N with 0 <= K < N, e.g. 0/2")
    return int(m[1]), int(m[2])


def _check(options: dict[str, Any]) -> None:
    if options["seq_cap"] is None:
        options["seq_cap"] = SEQ3_CAP if options["seq"] == 3 else 0


SPACE = OptionGroup("exhaustive space (the exhaustive engine, and engines that walk its space)", (
    Option("seq", "--seq", type=int, parse=parse_seq,
           help="sequence length: 1, 2 or 3 core ops (default 1, or the engine's own: 2 for mixed)"),
    Option("seq_cap", "--seq-cap", type=int, metavar="N",
           help=f"visit N workloads of a larger space: the first N of the ordered seq-2/3 space, N evenly "
                f"spread ones with --core-ops (default: all; {SEQ3_CAP} for --seq 3)"),
    Option("core_ops", "--core-ops", metavar="NAMES", parse=parse_core_ops,
           help="bound the space to these core ops, comma-separated, enumerated in that order "
                f"(default all: {', '.join(exhaustive.CORE_NAMES)})"),
    Option("shard", "--shard", default="0/1", metavar="K/N", parse=parse_shard,
           help="only workloads with index %% N == K (several machines)"),
), _check)


class ExhaustiveEngine(FuzzEngine):
    name = "exhaustive"
    summary = "every workload of the bounded ACE-style space, in index order"
    groups = (SPACE,)
    walks_space = True
    ends_space = True

    def run(self, w: Worker) -> None:
        run(w)


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
    if w.coord is not None:
        return run_joined(w)
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


def run_joined(w: Worker) -> None:
    order = space_order(w)
    while not w.should_stop():
        how = claim_and_run(w, order)
        if how == ALL_DONE:
            return
        if how == WAIT:
            w.stop.wait(WAIT_S)


def space_order(w: Worker) -> list[int]:
    """The joined campaign's positions: position k is the k-th index of the (capped) space."""
    return list(exhaustive.capped(w.options["seq"], w.options["seq_cap"], w.options.get("core_ops")))


def claim_and_run(w: Worker, order: list[int]) -> int:
    """Claim one position from the coordinator and, if one was handed out, run, triage and
    complete it; how the claim went (NEW, TAKEN_OVER, WAIT, ALL_DONE)."""
    assert w.coord is not None
    claim = w.coord.claim(len(order))
    if claim.how in (WAIT, ALL_DONE):
        return claim.how
    i = order[claim.position]
    trial = w.run(exhaustive.workload(w.options["seq"], i, w.options.get("core_ops")), engine="exhaustive",
                  index=i, position=claim.position)
    if trial is None:
        w.coord.release(claim.position, w.last_entry["error"], MAX_TRIES)
        return claim.how
    entry = w.last_entry
    w.triage(trial)  # before completing: a machine that dies while shrinking leaves the position to another
    w.coord.complete(claim.position, entry)
    return claim.how


register_engine(ExhaustiveEngine())
