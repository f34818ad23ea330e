"""Ops of different threads that the marks do not order: the outcomes of their other order.

The history (checkers/history.py) applies ops in the order of their completion
marks. For two ops of different threads on one file, a mark proves nothing
when the later-marked op was called before the earlier-marked one returned:
the calls overlapped (the kernel ran them in some serial order, either one),
or the marks reached the log in another order than the ops ran (a thread
delayed between its call's return and its mark). Only an op that returned
before another was called is surely before it.

For each such pair, the earlier-marked op R taking effect after the later L
is added as "maybe" events at L's position (allowed, never required, as a
failed write's bytes are): R's data where L changed the file, or for a
truncate, zeros past its length there and its length as the size (an empty
event). Each part lasts until an op called after R returned changed those
bytes (`until`): from then on no order leaves R's outcome there. A thread's
own ops are ordered by the thread: single-threaded workloads get none.
"""

from __future__ import annotations

import bisect

from checkers.eventindex import REGION, WIDE, RangeBuckets
from checkers.timeline import DataEvent, Exec, Inode
from foundation.intervals import merge_ranges, subtract_ranges

# Ops whose events set the size whatever it was (open and creat: O_TRUNC).
TRUNCATES = frozenset(("ftruncate", "truncate", "open", "creat"))
Ranges = list[tuple[int, int]]


def other_orders(execs: list[Exec], inodes: dict[int, Inode]) -> None:
    """Add the maybe events of every unordered pair of ops on each file (in position order)."""
    if len({ex.rec.thread for ex in execs}) < 2:
        return
    for ino in inodes.values():
        if ino.kind == "file" and not any(e.kind in ("collapse", "insert") for e in ino.events):
            # (moved ranges: the content check does not judge those precisely anyway)
            extra = FileOrders(execs, ino).alternatives()
            if extra:  # stable: at a position, the op's own events come first
                ino.events = sorted(ino.events + extra, key=lambda e: e.pos)


class FileOrders:
    """One file's ops (by position), what each changed, and the other orders of the unordered pairs."""

    def __init__(self, execs: list[Exec], ino: Inode) -> None:
        self.execs = execs
        self.by_pos: dict[int, list[DataEvent]] = {}
        for e in ino.events:
            if e.kind in ("data", "zero", "size"):
                self.by_pos.setdefault(e.pos, []).append(e)
        self.positions = sorted(self.by_pos)
        self.end = max((max(e.end, e.size) for e in ino.events), default=0)  # no byte past this was ever written
        self.reach = {x: self._reach(x) for x in self.positions}
        # The positions that changed bytes in each region, and those that set the size
        # (a truncate, or data up to the new size), for the ends of the maybe events.
        self.changed = RangeBuckets(REGION, WIDE)
        for x in self.positions:
            for s, t in self.reach[x]:
                self.changed.add(x, s, t)
        self.sizers = [x for x in self.positions if self.truncates(x)
                       or any(e.kind == "data" and e.end >= e.size for e in self.by_pos[x])]

    def truncates(self, x: int) -> bool:
        return self.execs[x].kind in TRUNCATES

    def _reach(self, x: int, past_length: bool = True) -> Ranges:
        """Where the op at X changed bytes; a truncate also everything past its length
        (PAST_LENGTH), whatever the size was in the order the model took."""
        events = self.by_pos[x]
        out = [(e.start, e.end) for e in events if e.kind in ("data", "zero") and e.end > e.start]
        if past_length and self.truncates(x) and events[-1].size < self.end:
            out.append((events[-1].size, self.end))
        return merge_ranges(out)

    def alternatives(self) -> list[DataEvent]:
        # Per thread, its ops on the file in program order (ascending positions) and the
        # running maximum of their end times: the ops of another thread that returned before
        # an op was called are a prefix of its list, found by bisection.
        threads: dict[int, tuple[list[int], list[int]]] = {}
        for x in self.positions:
            rec = self.execs[x].rec
            ps, ends = threads.setdefault(rec.thread, ([], []))
            ps.append(x)
            ends.append(max(rec.end_ns, ends[-1]) if ends else rec.end_ns)
        out: list[DataEvent] = []
        for q in self.positions:
            late = self.execs[q].rec
            for thread, (ps, ends) in threads.items():
                if thread != late.thread:
                    k = bisect.bisect_left(ps, q)
                    for p in ps[bisect.bisect_left(ends, late.start_ns, 0, k):k]:
                        if self.execs[p].rec.end_ns >= late.start_ns:
                            out += self.r_after_l(p, q)
        return out

    def r_after_l(self, p: int, q: int) -> list[DataEvent]:
        """The outcome of the op at P taking effect after the one at Q."""
        l_events = self.by_pos[q]
        if self.truncates(p):
            length = self.by_pos[p][-1].size
            # Two truncates leave the same zeros in either order (past the smaller length): only the size differs.
            zeros = subtract_ranges(self._reach(q, past_length=False), [(0, length)])
            return (self.until(p, q, zeros, DataEvent(q, "maybe", 0, 0, None, length))
                    + self.size_until(p, q, DataEvent(q, "maybe", length, length, None, length)))
        out = []
        for e in self.by_pos[p]:
            where = _intersect(self.reach[q], [(e.start, e.end)]) if e.kind in ("data", "zero") else []
            if where:
                size = max(l_events[-1].size, e.end) if e.src is not None else l_events[-1].size
                out += self.until(p, q, where, DataEvent(q, "maybe", 0, 0, e.src, size))
        return out

    def until(self, p: int, q: int, ranges: Ranges, proto: DataEvent) -> list[DataEvent]:
        """PROTO's outcome in RANGES as maybe events, each part ending (`until`) at the first
        op after Q called after the op at P returned that changed those bytes."""
        r_end = self.execs[p].rec.end_ns
        found: set[int] = set()
        for s, t in ranges:
            found |= self.changed.near(s, t)
        out: list[DataEvent] = []
        for x in sorted(x for x in found if x > q):
            if not ranges:
                break
            if self.execs[x].rec.start_ns > r_end:  # surely after R
                cover = self.reach[x]
                out += [_piece(proto, s, t, x) for s, t in _intersect(ranges, cover)]
                ranges = subtract_ranges(ranges, cover)
        return out + [_piece(proto, s, t, None) for s, t in ranges]

    def size_until(self, p: int, q: int, proto: DataEvent) -> list[DataEvent]:
        """PROTO, a size (an empty event), ending at the first op after Q called after the op
        at P returned that set the size (a truncate) or grew the file to its data's end."""
        r_end = self.execs[p].rec.end_ns
        for x in self.sizers[bisect.bisect_right(self.sizers, q):]:
            if self.execs[x].rec.start_ns > r_end:
                return [_piece(proto, proto.start, proto.end, x)]
        return [_piece(proto, proto.start, proto.end, None)]


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    return merge_ranges([(max(s, u), min(t, v)) for s, t in a for u, v in b if max(s, u) < min(t, v)])


def _piece(proto: DataEvent, start: int, end: int, until: int | None) -> DataEvent:
    return DataEvent(proto.pos, "maybe", start, end, proto.src, proto.size, until=until)
