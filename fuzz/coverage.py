"""Kernel coverage as campaign feedback: what a worker's runs reached, and what each run added.

A vm run's report.json has `coverage` (harness/backends/vm/coverage.py): per
path (workload, recovery) each function of the file system's modules that
ran and its call count. A worker keeps the union of its runs' features:
(path, function) and (path, function, hit bucket), the bucket AFL's coarse
classes of a count (`bucket`). A run's novelty is what it
added; its score weighs the recovery path RECOVERY_WEIGHT times the
workload path (a crash state driving new replay code is the prize) and a
new function above a new bucket of a known one.

Each journal entry of a run with coverage carries `coverage`: its function
counts per path and the functions new to its worker (`new_workload`,
`new_recovery`); the union of those over all workers' journals is the
campaign's coverage, and their times its curve (`campaign_coverage`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PATHS = ("workload", "recovery")
RECOVERY_WEIGHT = 3.0
FUNCTION_WEIGHT = 4.0   # a new function, against 1 for a new hit bucket of a known one
CURVE_POINTS = 200      # at most this many points in report.json's coverage curve


def bucket(n: int) -> int:
    """0, 1, 2, 3, then powers of two: the coarse classes AFL++ uses for hit counts."""
    return n if n < 4 else n.bit_length() + 2


@dataclass
class Novelty:
    functions: dict[str, list[str]] = field(default_factory=lambda: {p: [] for p in PATHS})
    buckets: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PATHS})

    def score(self) -> float:
        return sum((RECOVERY_WEIGHT if p == "recovery" else 1.0)
                   * (FUNCTION_WEIGHT * len(self.functions[p]) + self.buckets[p]) for p in PATHS)

    def __bool__(self) -> bool:
        return self.score() > 0


def run_hits(report: Mapping[str, Any]) -> dict[str, dict[str, int]] | None:
    """path -> function -> calls of a run's report.json; None if it has no kernel coverage."""
    cov = report.get("coverage")
    if not cov or not cov.get("available"):
        return None
    return {p: dict(cov.get(p, {}).get("hits", {})) for p in PATHS}


def reach(hits: Mapping[str, Mapping[str, int]]) -> float:
    """How much of the modules' code one run ran: its functions, recovery-path ones weighed
    RECOVERY_WEIGHT (Hypothesis' target(): a score that does not change when a run is repeated)."""
    return sum((RECOVERY_WEIGHT if p == "recovery" else 1.0) * len(hits.get(p, {})) for p in PATHS)


class CoverageMap:
    """The union of the features of the runs added so far (one worker's)."""

    def __init__(self) -> None:
        self.functions: dict[str, set[str]] = {p: set() for p in PATHS}
        self.buckets: dict[str, set[tuple[str, int]]] = {p: set() for p in PATHS}

    def add(self, hits: Mapping[str, Mapping[str, int]]) -> Novelty:
        nov = Novelty()
        for p in PATHS:
            for fn, n in hits.get(p, {}).items():
                if fn not in self.functions[p]:
                    self.functions[p].add(fn)
                    nov.functions[p].append(fn)
                b = (fn, bucket(n))
                if b not in self.buckets[p]:
                    self.buckets[p].add(b)
                    nov.buckets[p] += 1
            nov.functions[p].sort()
        return nov

    def sizes(self) -> dict[str, int]:
        return {p: len(self.functions[p]) for p in PATHS}


def journal_coverage(hits: Mapping[str, Mapping[str, int]], nov: Novelty) -> dict[str, Any]:
    """A journal entry's `coverage`: the run's function counts and what was new to its worker."""
    return {**{p: len(hits.get(p, {})) for p in PATHS}, **{f"new_{p}": nov.functions[p] for p in PATHS},
            "score": round(nov.score(), 1)}


def campaign_coverage(entries: Iterable[Mapping[str, Any]], start: float) -> dict[str, Any] | None:
    """report.json's `coverage` of a campaign from its journal entries (all workers, any order):
    the union per path, how many runs added to it, and its growth over campaign time
    (`over_time`: [seconds since START, workload functions, recovery functions])."""
    seen: dict[str, set[str]] = {p: set() for p in PATHS}
    timed = sorted((e for e in entries if isinstance(e.get("coverage"), dict)), key=lambda e: e.get("t", 0))
    if not timed:
        return None
    curve: list[list[float]] = []
    novel_runs = 0
    for e in timed:
        cov = e["coverage"]
        grew = False
        for p in PATHS:
            new = set(cov.get(f"new_{p}", ())) - seen[p]
            grew = grew or bool(new)
            seen[p] |= new
        if grew:
            novel_runs += 1
            curve.append([round(e.get("t", start) - start, 1), len(seen["workload"]), len(seen["recovery"])])
    if len(curve) > CURVE_POINTS:  # keep the last point; thin the rest evenly
        step = len(curve) / CURVE_POINTS
        curve = [curve[int(i * step)] for i in range(CURVE_POINTS - 1)] + [curve[-1]]
    return {"workload_functions": len(seen["workload"]), "recovery_functions": len(seen["recovery"]),
            "total_functions": len(seen["workload"] | seen["recovery"]), "runs": len(timed),
            "runs_with_new_functions": novel_runs, "over_time": curve}
