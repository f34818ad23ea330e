"""Shrinking a failing workload by itself: delta debugging over its ops.

Used for workloads Hypothesis did not generate (AFL++ findings, exhaustive
findings, `powercut minimize` on any workload); Hypothesis shrinks its own.
Steps, each keeping a candidate only if it still shows the target finding:
the same signature (fuzz/trial.py: kind, the op kind it is about or in
flight at its crash point, the rule or what the file system said), not
only the same kind. Matching the kind alone let a shrink slide from one bug
to another that shows under the same kind (seen: an ext4 fast_commit
finding in read-only recovery shrunk into a different, unfixed fast_commit
bug). `match="kind"` (`--shrink-match kind`) is the old behaviour, for
a user who wants the smallest workload with any finding of that kind.

1. cut every op after the one in flight at the finding's crash point (ops
   that had not started cannot matter to that crash state);
2. remove chunks of ops, halving the chunk size down to single ops, from
   the end backward (ddmin's complement removal, greedy), then single ops
   again until no op can go (1-minimal: the shrink is complete);
3. make op fields plainer: lengths to 4096, offsets to 0.

Every candidate is repaired first so it stays valid (an op on an fd whose
open was removed goes too, so does a second open of an fd still open) and
validated against the workload format; invalid candidates are skipped, not
run. Each run is a full recording and crash walk, so runs are cached and
bounded (MAX_RUNS, a deadline). `complete` says whether the shrink got to
its end or was cut short, and `cut_short` why (runs, deadline, stopped).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from foundation.errors import UsageError
from checkers.findings import Finding
from fuzz.layout import remove_owned
from fuzz.trial import Signature, Trial, op_count, signature
from workloads.format import parse_workload
from workloads.marks import parse_mark

MAX_RUNS = 400
Unit = tuple[int, int]   # (thread index, op index)
RunDoc = Callable[[dict[str, Any]], Trial]
MATCHES = ("signature", "kind")  # what a candidate must still show: the target's signature, or its kind only


@dataclass
class Shrinker:
    run: RunDoc                     # runs a candidate (in the caller's work dir)
    target: Signature               # the finding that must still show
    best_dir: str                   # where the best failing run is kept
    max_runs: int = MAX_RUNS
    deadline: float = float("inf")  # time.monotonic() value
    stopped: Callable[[], bool] = lambda: False  # the campaign is stopping: keep the best so far
    runs: int = 0
    cache: dict[str, bool] = field(default_factory=dict)
    cut_short: str = ""             # why the shrink did not get to its end ("" if it did)
    best: Trial | None = None       # the smallest failing run so far (in best_dir)
    match: str = "signature"        # one of MATCHES

    def __post_init__(self) -> None:
        if self.match not in MATCHES:
            raise UsageError(f"unknown shrink match {self.match!r} (known: {', '.join(MATCHES)})")

    def is_target(self, f: Finding, trial: Trial) -> bool:
        """Whether F (a finding of TRIAL) is the finding being shrunk."""
        if self.match == "kind":
            return f.kind == self.target.kind
        return f.kind == self.target.kind and signature(f, trial.plan) == self.target

    @property
    def complete(self) -> bool:
        return not self.cut_short

    def _budget_left(self) -> bool:
        if not self.cut_short:
            if self.runs >= self.max_runs:
                self.cut_short = f"run budget ({self.max_runs} runs) used up"
            elif time.monotonic() > self.deadline:
                self.cut_short = "time limit (--shrink-seconds) reached"
            elif self.stopped():
                self.cut_short = "the campaign was stopped"
        return not self.cut_short

    def fails(self, doc: dict[str, Any]) -> Trial | None:
        key = json.dumps(doc["threads"], sort_keys=True)
        if key in self.cache or not self._budget_left():
            return None
        try:
            parse_workload(doc)
        except UsageError:
            self.cache[key] = False
            return None
        self.runs += 1
        trial = self.run(doc)
        self.cache[key] = any(self.is_target(f, trial) for f in trial.findings)
        if not self.cache[key]:
            return None
        remove_owned(self.best_dir)
        os.replace(trial.out_dir, self.best_dir)
        trial.out_dir = self.best_dir
        self.best = trial
        return trial

    def shrink(self, trial: Trial) -> Trial:
        """The smallest variant of TRIAL (itself showing the target) that still shows it, found within the budget."""
        self.cache[json.dumps(trial.doc["threads"], sort_keys=True)] = True
        best = self._cut_after_crash(trial)
        best = self._remove_chunks(best)
        return self._plainer_fields(best)

    # -- steps ---------------------------------------------------------------
    def _cut_after_crash(self, trial: Trial) -> Trial:
        points = [f.crash_mark for f in trial.findings if f.crash_mark and self.is_target(f, trial)]
        marks = [m for m in map(parse_mark, points) if m is not None and m.seq is not None]
        if not marks or len(trial.doc["threads"]) != 1:
            return trial
        last = min(m.seq for m in marks) + 1  # the op in flight at the earliest such crash point
        units = [(0, i) for i in range(min(last + 1, op_count(trial.doc)))]
        return self._try(trial, units) or trial

    def _remove_chunks(self, best: Trial) -> Trial:
        """One pass per chunk size, n/2 down to 1, then passes of single-op removals
        until one removes nothing (every candidate is cached, so a last pass is cheap
        where nothing changed)."""
        units = all_units(best.doc)
        chunk = max(1, len(units) // 2)
        while chunk >= 1:
            before = len(units)
            i = len(units) - chunk
            while i >= 0:
                cand = units[:i] + units[i + chunk:]
                got = self._try(best, cand) if cand else None
                if got is not None:
                    best, units = got, all_units(got.doc)
                    i = min(i, len(units)) - chunk
                else:
                    i -= chunk
            if chunk > 1 or len(units) == before or not self._budget_left():
                chunk //= 2
        return best

    def _plainer_fields(self, best: Trial) -> Trial:
        for ti, thread in enumerate(best.doc["threads"]):
            for oi in range(len(thread["ops"])):
                for name, plain in (("length", 4096), ("offset", 0)):
                    op = best.doc["threads"][ti]["ops"][oi]
                    if name in op and op[name] != plain and op["op"] not in ("ftruncate", "truncate"):
                        doc = json.loads(json.dumps(best.doc))
                        doc["threads"][ti]["ops"][oi][name] = plain
                        best = self.fails(doc) or best
        return best

    def _try(self, base: Trial, units: list[Unit]) -> Trial | None:
        return self.fails(subset(base.doc, units))


def all_units(doc: dict[str, Any]) -> list[Unit]:
    return [(ti, oi) for ti, t in enumerate(doc["threads"]) for oi in range(len(t["ops"]))]


def subset(doc: dict[str, Any], units: list[Unit]) -> dict[str, Any]:
    """DOC with only the ops in UNITS, repaired; threads left without ops are dropped."""
    keep = set(units)
    threads = []
    for ti, t in enumerate(doc["threads"]):
        ops = repair([op for oi, op in enumerate(t["ops"]) if (ti, oi) in keep])
        if ops:
            threads.append({**t, "ops": ops})
    return {**doc, "threads": threads or [{**doc["threads"][0], "ops": []}]}


def repair(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop ops on fds that are not open there, and opens of fds already open."""
    open_fds: set[str] = set()
    out = []
    for op in ops:
        fd = op.get("fd")
        if op["op"] in ("open", "creat"):
            if fd in open_fds:
                continue
            open_fds.add(fd)
        elif fd is not None:
            if fd not in open_fds or op.get("from_fd", fd) not in open_fds:  # copy, clone: both fds
                continue
            if op["op"] == "close":
                open_fds.discard(fd)
        out.append(op)
    return out
