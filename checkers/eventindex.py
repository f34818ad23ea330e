"""Which of an inode's events a crash point allows, without a walk over its history.

A crash point allows every op before `n_done` and a few in flight. An
inode's events are in position order (checkers/history.py applies ops in
completion order), so the allowed ones are an index prefix plus the
in-flight ones, found by bisection; the events of each kind, each writer
and each region of the file are indexed once per inode. The content
oracle's per-file setup then costs O(what the check looks at), not
O(every event the file ever had): fsync-under-load at --scale 1.0 has
~300000 appends per writer file, and a list comprehension over them at
every crash state made its walk take ~1 s a state.

`PlainEvents` answers the same questions by filtering every event, as the
oracle did before; tests/test_oracle_indexed.py holds the two to the same
findings on real crash images.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from checkers.timeline import DataEvent, Inode

LAYER_KINDS = ("data", "zero", "maybe")   # events that can put bytes in a range
REGION = 1 << 16                          # bytes per region of the overlap index
WIDE = 64                                 # events spanning more regions are kept apart


class RangeBuckets:
    """Items by the byte ranges they touch, in REGION-byte buckets; one spanning WIDE or more
    buckets is kept apart and is a candidate for every query. What overlaps a range is then
    found among the items near it, not among all of them."""

    def __init__(self, region: int, wide: int) -> None:
        self.region, self.width = region, wide
        self.buckets: dict[int, list[int]] = {}
        self.wide: list[int] = []

    def _span(self, start: int, end: int) -> range:
        r0 = start // self.region
        return range(r0, max(r0, (end - 1) // self.region) + 1)  # an empty range: its start's bucket

    def add(self, item: int, start: int, end: int) -> None:
        span = self._span(start, end)
        if len(span) > self.width:
            self.wide.append(item)
        else:
            for r in span:
                self.buckets.setdefault(r, []).append(item)

    def near(self, start: int, end: int) -> set[int]:
        """The items whose ranges may overlap [start, end) (a superset: check each)."""
        got = set(self.wide)
        for r in self._span(start, end):
            got.update(self.buckets.get(r, ()))
        return got


class Allowed:
    """The positions allowed at a crash point, as a set: all below N_DONE, and
    INFLIGHT. Not spelled out: a run of millions of ops would build a set that
    size at every state."""

    __slots__ = ("n_done", "inflight")

    def __init__(self, n_done: int, inflight: frozenset[int]) -> None:
        self.n_done = n_done
        self.inflight = frozenset(p for p in inflight if p >= n_done)

    def __contains__(self, pos: object) -> bool:
        return isinstance(pos, int) and (0 <= pos < self.n_done or pos in self.inflight)

    def __iter__(self) -> Iterator[int]:
        yield from range(self.n_done)
        yield from sorted(self.inflight)

    def __len__(self) -> int:
        return self.n_done + len(self.inflight)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Allowed):
            return (self.n_done, self.inflight) == (other.n_done, other.inflight)
        return isinstance(other, (set, frozenset)) and set(self) == other

    __hash__ = None  # type: ignore[assignment]

    def last(self) -> int:
        """max(self, default=0) without a walk."""
        return max(self.inflight, default=self.n_done - 1 if self.n_done > 0 else 0)


def live_maybe(e: DataEvent, floor: int) -> bool:
    """A maybe event still allowed with the guarantee's base at FLOOR: a failed write's
    bytes always; another order's outcome (checkers/overlap.py) until an op sure to
    come after it is in that base."""
    return e.until is None or e.until >= floor


def last_allowed(allowed: Allowed | set[int]) -> int:
    return allowed.last() if isinstance(allowed, Allowed) else max(allowed, default=0)


class EventIndex:
    """One inode's events indexed by position, kind, writer and region (built once)."""

    def __init__(self, ino: Inode, classified: Callable[[DataEvent], bool]) -> None:
        ev = self.events = ino.events
        self.pos = [e.pos for e in ev]
        self.sizes = np.fromiter((e.size for e in ev), dtype=np.int64, count=len(ev))
        self.of_kind: dict[str, list[int]] = {}
        self.by_writer: dict[tuple[int, int, int], list[int]] = {}
        self.near = RangeBuckets(REGION, WIDE)
        self.classified = [i for i, e in enumerate(ev) if e.kind == "data" and classified(e)]
        for i, e in enumerate(ev):
            self.of_kind.setdefault(e.kind, []).append(i)
            if e.kind in ("data", "maybe") and e.src is not None:
                self.by_writer.setdefault((e.src.file_id, e.src.seq, e.src.iter), []).append(i)
            if e.kind in LAYER_KINDS:  # empty ones too: the plain filter lists them
                self.near.add(i, e.start, e.end)

    def fresh(self, ino: Inode) -> bool:
        return self.events is ino.events and len(self.pos) == len(ino.events)

    def overlapping(self, start: int, end: int) -> list[int]:
        """Indices of the data, zero and maybe events overlapping [start, end), ascending."""
        if end <= start:
            return []
        ev = self.events
        return sorted(i for i in self.near.near(start, end) if ev[i].start < end and ev[i].end > start)


class PointEvents:
    """An inode's events at one crash point, by index: `history` (every allowed
    event) and `later` (the allowed ones at or after the guarantee's FLOOR).
    Every answer lists events in the inode's event order."""

    def __init__(self, idx: EventIndex, allowed: Allowed, floor: int) -> None:
        self.idx = idx
        self.floor = floor
        self.done = bisect.bisect_left(idx.pos, allowed.n_done)     # events [0, done) completed
        self.lo = bisect.bisect_left(idx.pos, floor)                # `later` starts here
        extra: list[int] = []
        for p in sorted(allowed.inflight):
            extra += range(bisect.bisect_left(idx.pos, p), bisect.bisect_right(idx.pos, p))
        self.extra = extra                                          # in-flight events (all >= done)
        self._extra = set(extra)

    def in_history(self, i: int) -> bool:
        return i < self.done or i in self._extra

    def in_later(self, i: int) -> bool:
        return i >= self.lo and self.in_history(i)

    def maybe_live(self, i: int) -> bool:
        """An allowed maybe event that no op in the guarantee's base has ended (live_maybe)."""
        return self.idx.events[i].kind == "maybe" and self.in_history(i) and live_maybe(self.idx.events[i], self.floor)

    def maybes(self) -> list[DataEvent]:
        """The allowed maybe events still live (live_maybe)."""
        ids = self.idx.of_kind.get("maybe", [])
        return [self.idx.events[i] for i in ids if self.maybe_live(i)]

    def _kind(self, kind: str, lo: int) -> list[DataEvent]:
        ids = self.idx.of_kind.get(kind, [])
        a, b = bisect.bisect_left(ids, lo), bisect.bisect_left(ids, self.done)
        ev = self.idx.events
        return [ev[i] for i in ids[a:b]] + [ev[i] for i in self.extra if i >= lo and ev[i].kind == kind]

    def later_of(self, kind: str) -> list[DataEvent]:
        return self._kind(kind, self.lo)

    def history_of(self, kind: str) -> list[DataEvent]:
        return self._kind(kind, 0)

    def later_sizes(self) -> tuple[int, int] | None:
        """(min, max) of the sizes after the `later` events; None: there are none."""
        sizes = [self.idx.events[i].size for i in self.extra if i >= self.lo]
        part = self.idx.sizes[self.lo:self.done]
        if len(part):
            sizes += [int(part.min()), int(part.max())]
        return (min(sizes), max(sizes)) if sizes else None

    def writer_events(self, key: tuple[int, int, int]) -> list[DataEvent]:
        """The `later` data and maybe events of writer KEY, and its allowed maybe events."""
        ev = self.idx.events
        return [ev[i] for i in self.idx.by_writer.get(key, ()) if self.in_later(i) or self.maybe_live(i)]

    def layer_events(self, start: int, end: int, strict: bool) -> list[DataEvent]:
        """Data, zero and maybe events overlapping [start, end): STRICT the `later` ones,
        else all of `history`; then the allowed maybe events not among them."""
        ev = self.idx.events
        first, then = [], []
        for i in self.idx.overlapping(start, end):
            if self.in_later(i) if strict else self.in_history(i):
                first.append(ev[i])
            elif self.maybe_live(i):
                then.append(ev[i])
        return first + then

    def overlapping(self, start: int, end: int) -> list[DataEvent]:
        """Allowed data, zero and maybe events overlapping [start, end)."""
        ev = self.idx.events
        return [ev[i] for i in self.idx.overlapping(start, end) if self.in_history(i)]

    def classified(self) -> list[DataEvent]:
        """The allowed data events whose writes are classified (checkers/untorn.py)."""
        ids, ev = self.idx.classified, self.idx.events
        k = bisect.bisect_left(ids, self.done)
        return [ev[i] for i in ids[:k]] + [ev[i] for i in ids[k:] if i in self._extra]


class PlainEvents:
    """The same answers as PointEvents by filtering every event of the inode: the
    reference (ContentOracle.indexed = False)."""

    def __init__(self, ino: Inode, allowed: Any, floor: int, classified: Callable[[DataEvent], bool]) -> None:
        self.ino = ino
        self.allowed = allowed
        self.later = [e for e in ino.events if e.pos >= floor and e.pos in allowed]
        self.history = [e for e in ino.events if e.pos in allowed]
        self.floor = floor
        self.wanted = classified

    def later_of(self, kind: str) -> list[DataEvent]:
        return [e for e in self.later if e.kind == kind]

    def history_of(self, kind: str) -> list[DataEvent]:
        return [e for e in self.history if e.kind == kind]

    def later_sizes(self) -> tuple[int, int] | None:
        sizes = [e.size for e in self.later]
        return (min(sizes), max(sizes)) if sizes else None

    def maybes(self) -> list[DataEvent]:
        return [e for e in self.history_of("maybe") if live_maybe(e, self.floor)]

    def writer_events(self, key: tuple[int, int, int]) -> list[DataEvent]:
        return [e for e in self.later + [m for m in self.maybes() if m not in self.later]
                if e.kind in ("data", "maybe") and e.src is not None and (e.src.file_id, e.src.seq, e.src.iter) == key]

    def layer_events(self, start: int, end: int, strict: bool) -> list[DataEvent]:
        events = self.later if strict else self.history
        return [e for e in events + [m for m in self.maybes() if m not in events]
                if e.kind in LAYER_KINDS and e.start < end and e.end > start]

    def overlapping(self, start: int, end: int) -> list[DataEvent]:
        return [e for e in self.history if e.kind in LAYER_KINDS and e.start < end and e.end > start]

    def classified(self) -> list[DataEvent]:
        return [e for e in self.history if e.kind == "data" and self.wanted(e)]
