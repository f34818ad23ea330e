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
import itertools

from checkers.history import DataEvent, Exec, Inode
from foundation.intervals import merge_ranges, subtract_ranges

# Ops whose events set the size whatever it was (open and creat: O_TRUNC).
TRUNCATES = frozenset(("ftruncate", "truncate", "open", "creat"))
Ranges = list[tuple[int, int]]


def other_orders(execs: list[Exec], inodes: dict[int, Inode]) -> None:
    """Add the maybe events of every unordered pair of ops on each file (in position order)."""
    if len({ex.rec.thread for ex in execs}) < 2:
        return
    ended_by = list(itertools.accumulate((ex.rec.end_ns for ex in execs), max))
    for ino in inodes.values():
        extra = _file_alternatives(execs, ended_by, ino) if ino.kind == "file" else []
        if extra:
            # stable: at a position, the op's own events come first
            ino.events = sorted(ino.events + extra, key=lambda e: e.pos)


def _file_alternatives(execs: list[Exec], ended_by: list[int], ino: Inode) -> list[DataEvent]:
    by_pos: dict[int, list[DataEvent]] = {}
    for e in ino.events:
        if e.kind in ("collapse", "insert"):
            return []  # moved ranges: the content check does not judge those precisely anyway
        if e.kind in ("data", "zero", "size"):
            by_pos.setdefault(e.pos, []).append(e)
    positions = sorted(by_pos)
    end = max((max(e.end, e.size) for e in ino.events), default=0)  # no byte past this was ever written
    out: list[DataEvent] = []
    for k, q in enumerate(positions):
        late = execs[q].rec
        # positions below the first whose op returned at or after L's call are all before L
        first = bisect.bisect_left(positions, bisect.bisect_left(ended_by, late.start_ns))
        for p in positions[first:k]:
            early = execs[p].rec
            if early.thread != late.thread and early.end_ns >= late.start_ns:
                out += _r_after_l(execs, positions, by_pos, p, q, end)
    return out


def _reach(ex: Exec, events: list[DataEvent], end: int, past_length: bool = True) -> Ranges:
    """Where EX (its EVENTS on the file) changed bytes; a truncate also everything past its
    length (PAST_LENGTH), whatever the size was in the order the model took."""
    out = [(e.start, e.end) for e in events if e.kind in ("data", "zero") and e.end > e.start]
    if past_length and ex.kind in TRUNCATES and events[-1].size < end:
        out.append((events[-1].size, end))
    return merge_ranges(out)


def _r_after_l(execs: list[Exec], positions: list[int], by_pos: dict[int, list[DataEvent]],
               p: int, q: int, end: int) -> list[DataEvent]:
    r, l_events = execs[p], by_pos[q]
    truncate = r.kind in TRUNCATES
    # Two truncates leave the same zeros in either order (past the smaller length): only the size differs.
    where = _reach(execs[q], l_events, end, past_length=not truncate)
    size_l = l_events[-1].size
    parts: list[tuple[Ranges, DataEvent]] = []
    if truncate:
        length = by_pos[p][-1].size
        zeros = subtract_ranges(where, [(0, length)])
        parts = [(zeros, DataEvent(q, "maybe", 0, 0, None, length)),
                 ([], DataEvent(q, "maybe", length, length, None, length))]  # its size: an empty event
    else:
        for e in by_pos[p]:
            if e.kind in ("data", "zero"):
                size = max(size_l, e.end) if e.src is not None else size_l
                parts.append((_intersect(where, [(e.start, e.end)]), DataEvent(q, "maybe", 0, 0, e.src, size)))
    return [piece for ranges, proto in parts for piece in _expire(execs, positions, by_pos, p, q, ranges, proto, end)
            if ranges or proto.start == proto.end and proto.src is None]


def _expire(execs: list[Exec], positions: list[int], by_pos: dict[int, list[DataEvent]], p: int, q: int,
            ranges: Ranges, proto: DataEvent, end: int) -> list[DataEvent]:
    """PROTO's outcome in RANGES (none: its size alone) as maybe events, each part ending
    (`until`) at the first op called after R (at P) returned that changed those bytes, or for
    the size, that set it (a truncate) or grew the file past it (its data ends at the size)."""
    out: list[DataEvent] = []
    r_end = execs[p].rec.end_ns
    sized = not ranges
    for x in positions[bisect.bisect_right(positions, q):]:
        if not (ranges or sized):
            break
        ex = execs[x]
        if ex.rec.start_ns <= r_end:
            continue  # not surely after R
        cover = _reach(ex, by_pos[x], end)
        out += [_piece(proto, s, t, x) for s, t in _intersect(ranges, cover)]
        ranges = subtract_ranges(ranges, cover)
        if sized and (ex.kind in TRUNCATES or any(e.kind == "data" and e.end >= e.size for e in by_pos[x])):
            out.append(_piece(proto, proto.start, proto.end, x))
            sized = False
    out += [_piece(proto, s, t, None) for s, t in ranges]
    if sized:
        out.append(_piece(proto, proto.start, proto.end, None))
    return out


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    return merge_ranges([(max(s, u), min(t, v)) for s, t in a for u, v in b if max(s, u) < min(t, v)])


def _piece(proto: DataEvent, start: int, end: int, until: int | None) -> DataEvent:
    return DataEvent(proto.pos, "maybe", start, end, proto.src, proto.size, until=until)
