"""Which ops had returned, and which may be in flight, at a crash point (no I/O)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from checkers.eventindex import Allowed
from checkers.history import History


@dataclass
class PointView:
    """What the model allows at one crash point."""

    n_done: int                          # ops at positions < n_done had returned
    allowed: Allowed                     # done and in-flight positions
    versions_after: list[int]            # namespace versions beyond n_done reachable by in-flight ops
    fuzzy: set[str] = field(default_factory=set)   # paths an unreachable in-flight op touched
    inflight: frozenset[int] = frozenset()         # allowed positions >= n_done


class CrashPoints:
    """Turns a crash point (a log mark) into the PointView of the history."""

    def __init__(self, history: History) -> None:
        self.h = history
        self._marks = sorted(ex.mark for ex in history.execs if ex.mark is not None)
        # Per thread, its positions in program order when they ascend (the usual case):
        # the first unfinished op is then found by bisection.
        self._ascending = {t: ps == sorted(ps) for t, ps in history.threads.items()}

    def view(self, crash_point: int) -> PointView:
        n_done = bisect.bisect_right(self._marks, crash_point)
        inflight = set()
        # The first unfinished op of each thread may be in flight (counting one
        # that had not started yet as in flight only allows more states).
        for t, positions in self.h.threads.items():
            if self._ascending[t]:
                k = bisect.bisect_left(positions, n_done)
                if k < len(positions):
                    inflight.add(positions[k])
                continue
            for pos in positions:
                if pos >= n_done:
                    inflight.add(pos)
                    break
        allowed = Allowed(n_done, frozenset(inflight))
        versions, fuzzy = [], set()
        for pos in sorted(inflight):
            if all(p in allowed for p in range(n_done, pos + 1)):
                versions.append(pos + 1)
            else:  # an op not yet started sits between: its names are not modelled here
                fuzzy |= {p for c_pos, paths, _ in self.h.name_changes if c_pos == pos for p in paths}
        return PointView(n_done, allowed, versions, fuzzy, allowed.inflight)
