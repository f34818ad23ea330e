"""Crash states: what the device may hold after losing power at a crash point.

The model is the block layer's guarantees and nothing more
(block-recording.md):

- Crash point P: log entries 0..P had completed when the power went out.
- A FLUSH entry makes every entry logged before it durable, but only once
  it has completed, and that is known only when a later entry was logged.
  At a crash point that is itself a FLUSH the flush is still in flight: the
  epoch it would have closed is still open. (A FLUSH|FUA entry completes
  with its FUA write, so it is complete at its own crash point.) A FLUSH
  entry's own data comes after its pre-flush: it is in the new epoch unless
  it is FUA.
- FUA writes are durable once logged.
- Every other write or discard logged since the last completed flush (the
  epoch) may or may not have reached the media, in any combination, and a
  multi-sector write may have reached it only in part, in atomic units of
  512 B or 4 KiB.
- mkfs is not under test: entries up to the mkfs-done mark are durable.

A crash state is therefore the base image (every entry before the epoch
replayed in order) plus the persisted parts of the epoch's writes, applied
in log order. Each state has an id that names it completely given the log,
so one state can be rebuilt alone (`powercut crash-image --state ID`):

    p57              the in-order prefix: everything through entry 57
    p57-d33          ... with the write at entry 33 dropped
    p57-t33k0-2      ... with entry 33 torn: only its 4 KiB units 0..1
                     persisted (`s` instead of `k`: 512 B units)
    p57-r12          ... with random subset 12 of the epoch's writes
                     (seeded by the id, so always the same subset)
    p57-e5           ... with subset 5 of the exhaustive enumeration (bit j
                     set: the epoch's j-th droppable write persisted)
"""

from __future__ import annotations

import bisect
import os
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from foundation.errors import UsageError
from replay.crashpoints import mkfs_done, select_crash_points
from replay.logformat import Entry, LogReader

# The default: prefix + every single dropped write. It is the cheapest mode
# that catches a missing flush: in-order prefixes never lose fsync'd data on
# ext4 even with barrier=0 (jbd2 waits for its own writes before the commit
# block), but dropping one write of a too-long epoch does (~37 % of states,
# block-recording.md). It costs one state per write of the epoch, capped per
# crash point, while exhaustive and sampled subsets cost 2^n or N states per
# point whatever the epoch.
DEFAULT_REORDER = "drop-one"
# Per crash point and mode, at most this many reorder states; beyond it a
# sample seeded by the crash point (so the same log always gives the same states).
DEFAULT_PER_POINT = 16
UNITS = {"s": 512, "k": 4096}
_UNIT_LETTER = {v: k for k, v in UNITS.items()}
T = TypeVar("T")
# A state inside the recovery of another (checkers/crashwalk/recovery_crash.py): ORIGINAL/rN[-...]
# is state pN[-...] of the log recorded while crash state ORIGINAL was recovered.
_RECOVERY_ID = re.compile(r"(p[^/]+)/r(\d+.*)")
_ID = re.compile(r"p(\d+)(?:-(?:d(\d+)|t(\d+)([sk])(\d+)-(\d+)|r(\d+)|e([0-9a-f]+)))?")


@dataclass(frozen=True)
class ReorderSpec:
    """What `--reorder` asked for."""

    drop_one: bool = False
    torn_units: tuple[int, ...] = ()
    sample: int = 0
    exhaustive: int | None = None    # K: enumerate epochs of <= K droppable writes
    per_point: int = DEFAULT_PER_POINT
    text: str = field(default="none", compare=False)  # as the user wrote it (the report's `reorder`)

    @classmethod
    def parse(cls, spec: str, per_point: int = DEFAULT_PER_POINT) -> ReorderSpec:
        if per_point < 1:
            raise UsageError(f"--states-per-point {per_point}: must be at least 1")
        words = [w.strip() for w in spec.split(",")]
        if words == ["none"]:
            return cls(per_point=per_point, text=spec)
        drop_one, units, sample, exhaustive = False, [], 0, None
        for word in words:
            name, _, arg = word.partition(":")
            if word == "drop-one":
                drop_one = True
            elif name == "torn" and arg in ("", "512", "4096"):
                units.append(int(arg or 4096))
            elif name == "sample" and arg.isdigit() and int(arg) > 0:
                sample = int(arg)
            elif name == "exhaustive" and arg.isdigit() and 0 < int(arg) <= 16:
                exhaustive = int(arg)
            else:
                raise UsageError(f"--reorder {spec!r}: {word!r} is not one of none, drop-one, torn, torn:512, "
                                 "torn:4096, sample:N (N > 0), exhaustive:K (1 <= K <= 16)")
        return cls(drop_one, tuple(sorted(set(units))), sample, exhaustive, per_point, spec)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Tear:
    """Write ENTRY persisted only in its units FIRST..END-1 (device sectors START..STOP-1)."""

    entry: int
    unit: int
    first: int
    end: int
    start: int
    stop: int


@dataclass(frozen=True)
class Piece:
    """Sectors [start, stop) of ENTRY's write (or discard) reached the media."""

    entry: Entry
    start: int
    stop: int


@dataclass(frozen=True, eq=False)
class CrashState:
    """One crash state: the base image through EPOCH_START-1 plus the persisted epoch."""

    id: str
    point: int                      # crash point: entries 0..point had completed
    mode: str                       # prefix | drop | torn | sample | exhaustive
    epoch_start: int                # every entry before this index persisted
    epoch: tuple[Entry, ...]        # writes and discards in [epoch_start, point], log order
    mark: str | None                # the last mark at or before the crash point
    mark_index: int | None
    dropped: frozenset[int] = field(default_factory=frozenset)
    tear: Tear | None = None

    @property
    def persisted(self) -> tuple[int, ...]:
        """Indices of the epoch's entries that persisted whole."""
        torn = self.tear.entry if self.tear else -1
        return tuple(e.index for e in self.epoch if e.index not in self.dropped and e.index != torn)

    @property
    def torn(self) -> tuple[int, ...]:
        return (self.tear.entry,) if self.tear else ()

    def pieces(self) -> Iterator[Piece]:
        """What of the epoch reached the media, in log order."""
        for e in self.epoch:
            if e.index in self.dropped:
                continue
            if self.tear and e.index == self.tear.entry:
                yield Piece(e, self.tear.start, self.tear.stop)
            else:
                yield Piece(e, e.sector, e.sector + e.nr_sectors)


def durable_before(reader: LogReader) -> int:
    """Entries before this index are durable in every state (mkfs and what precedes it)."""
    m = mkfs_done(reader)
    return 0 if m is None else m + 1


def unit_cuts(entry: Entry, unit: int, sectorsize: int) -> list[int]:
    """Sector boundaries of ENTRY's atomic units: its ends plus every UNIT-aligned offset inside."""
    step = max(unit, sectorsize) // sectorsize
    start, stop = entry.sector, entry.sector + entry.nr_sectors
    inner = range((start // step + 1) * step, stop, step)
    return [start, *inner, stop]


@dataclass(frozen=True)
class _Epoch:
    point: int
    start: int
    entries: tuple[Entry, ...]
    droppable: tuple[Entry, ...]    # not FUA: may or may not have persisted
    mark: str | None
    mark_index: int | None


class CrashPlan:
    """Every crash state of POINTS under SPEC, in order; and any one state by its id."""

    def __init__(self, entries: Sequence[Entry], sectorsize: int, points: Sequence[int],
                 spec: ReorderSpec, durable: int = 0) -> None:
        self.entries = entries
        self.sectorsize = sectorsize
        self.points = points
        self.spec = spec
        self.durable = durable
        self._flushes = [e.index for e in entries if e.is_flush]
        self._changes = [e.index for e in entries if e.is_write or e.is_discard]
        self._marks = [e.index for e in entries if e.is_mark]

    def __len__(self) -> int:
        return sum(1 for _ in self.states())

    def states(self) -> Iterator[CrashState]:
        for point in self.points:
            yield from self.states_at(point)

    # -- the epoch of a crash point ------------------------------------------
    def epoch_start(self, point: int) -> int:
        i = bisect.bisect_right(self._flushes, point) - 1
        if i >= 0 and self._flushes[i] == point and not self.entries[point].is_fua:
            i -= 1  # in flight
        start = self.durable
        if i >= 0:
            f = self.entries[self._flushes[i]]
            start = max(start, f.index if f.is_write and not f.is_fua else f.index + 1)
        return min(start, point + 1)

    def _epoch(self, point: int) -> _Epoch:
        if not 0 <= point < len(self.entries):
            raise UsageError(f"crash point {point}: the log has entries 0..{len(self.entries) - 1}")
        start = self.epoch_start(point)
        lo, hi = bisect.bisect_left(self._changes, start), bisect.bisect_right(self._changes, point)
        entries = tuple(self.entries[i] for i in self._changes[lo:hi])
        m = bisect.bisect_right(self._marks, point) - 1
        mark_index = self._marks[m] if m >= 0 else None
        mark = self.entries[mark_index].mark if mark_index is not None else None
        return _Epoch(point, start, entries, tuple(e for e in entries if not e.is_fua), mark, mark_index)

    def _state(self, ep: _Epoch, suffix: str, mode: str, dropped: frozenset[int] = frozenset(),
               tear: Tear | None = None) -> CrashState:
        return CrashState(f"p{ep.point}{suffix}", ep.point, mode, ep.start, ep.entries, ep.mark,
                          ep.mark_index, dropped, tear)

    # -- generation ------------------------------------------------------------
    def states_at(self, point: int) -> Iterator[CrashState]:
        ep = self._epoch(point)
        yield self._state(ep, "", "prefix")
        if not ep.droppable:
            return
        spec = self.spec
        if spec.drop_one:
            for e in self._capped(ep.droppable, point, "drop"):
                yield self._drop(ep, e.index)
        for unit in spec.torn_units:
            tears = [t for e in ep.droppable if e.is_write for t in self._tears(e, unit)]
            for t in self._capped(tears, point, f"torn{unit}"):
                yield self._torn(ep, t)
        samples = spec.sample
        if spec.exhaustive is not None:
            if len(ep.droppable) <= spec.exhaustive:
                for mask in range((1 << len(ep.droppable)) - 1):
                    yield self._subset(ep, mask)
            else:  # too many for 2^n: sample instead, as many as a mode gets per point
                samples = max(samples, spec.per_point)
        for n in range(samples):
            yield self._sample(ep, n)

    def _capped(self, items: Sequence[T], point: int, mode: str) -> list[T]:
        if len(items) <= self.spec.per_point:
            return list(items)
        keep = sorted(random.Random(f"p{point}:{mode}").sample(range(len(items)), self.spec.per_point))
        return [items[i] for i in keep]

    def _tears(self, entry: Entry, unit: int) -> list[Tear]:
        """Head and tail parts of ENTRY split after its first unit, at its middle and before its last."""
        n = len(unit_cuts(entry, unit, self.sectorsize)) - 1
        splits = sorted({1, n // 2, n - 1} & set(range(1, n)))
        return [self._tear(entry, unit, a, b) for k in splits for a, b in ((0, k), (k, n))]

    def _tear(self, entry: Entry, unit: int, first: int, end: int) -> Tear:
        cuts = unit_cuts(entry, unit, self.sectorsize)
        return Tear(entry.index, unit, first, end, cuts[first], cuts[end])

    def _drop(self, ep: _Epoch, index: int) -> CrashState:
        return self._state(ep, f"-d{index}", "drop", frozenset([index]))

    def _torn(self, ep: _Epoch, t: Tear) -> CrashState:
        return self._state(ep, f"-t{t.entry}{_UNIT_LETTER[t.unit]}{t.first}-{t.end}", "torn", tear=t)

    def _subset(self, ep: _Epoch, mask: int) -> CrashState:
        dropped = frozenset(e.index for j, e in enumerate(ep.droppable) if not mask >> j & 1)
        return self._state(ep, f"-e{mask:x}", "exhaustive", dropped)

    def _sample(self, ep: _Epoch, n: int) -> CrashState:
        rng = random.Random(f"p{ep.point}-r{n}")
        dropped = frozenset(e.index for e in ep.droppable if rng.random() < 0.5)
        return self._state(ep, f"-r{n}", "sample", dropped)

    # -- one state by id ---------------------------------------------------------
    def state(self, state_id: str) -> CrashState:
        """The state STATE_ID names; UsageError if it cannot exist in this log."""
        m = _ID.fullmatch(state_id)
        if not m:
            raise UsageError(f"state {state_id!r}: not a state id (p<entry>[-d<entry>|-t<entry><s|k><a>-<b>|-r<n>|-e<hex>])")
        point, drop, torn, letter, first, end, sample, mask = m.groups()
        ep = self._epoch(int(point))
        droppable = {e.index: e for e in ep.droppable}
        if drop is not None:
            if int(drop) not in droppable:
                raise self._not_in_epoch(state_id, ep, int(drop))
            return self._drop(ep, int(drop))
        if torn is not None:
            entry = droppable.get(int(torn))
            if entry is None or not entry.is_write:
                raise self._not_in_epoch(state_id, ep, int(torn))
            n = len(unit_cuts(entry, UNITS[letter], self.sectorsize)) - 1
            a, b = int(first), int(end)
            if not (0 <= a < b <= n and (a, b) != (0, n)):
                raise UsageError(f"state {state_id!r}: entry {torn} has {n} units; want a part a-b with 0 <= a < b <= {n}, not all of it")
            return self._torn(ep, self._tear(entry, UNITS[letter], a, b))
        if sample is not None:
            return self._sample(ep, int(sample))
        if mask is not None:
            if int(mask, 16) >= (1 << len(ep.droppable)) - 1:
                raise UsageError(f"state {state_id!r}: the epoch has {len(ep.droppable)} droppable writes; "
                                 f"subset masks go up to {(1 << len(ep.droppable)) - 2:x}")
            return self._subset(ep, int(mask, 16))
        return self._state(ep, "", "prefix")

    def _not_in_epoch(self, state_id: str, ep: _Epoch, index: int) -> UsageError:
        return UsageError(f"state {state_id!r}: entry {index} is not a droppable write of crash point {ep.point}'s "
                          f"epoch (entries {ep.start}..{ep.point}: {[e.index for e in ep.droppable] or 'none'})")


def plan_for_log(reader: LogReader, points: Sequence[int], spec: ReorderSpec) -> CrashPlan:
    """The crash plan of a log recorded by `powercut run` (or any log: then nothing is durable up front)."""
    return CrashPlan(list(reader.entries()), reader.sectorsize, points, spec, durable_before(reader))


def split_recovery_id(state_id: str) -> tuple[str, str | None]:
    """`p57-d3/r12-d10` -> ("p57-d3", "p12-d10"): the original state and the state of its
    recovery log; a plain id -> (id, None)."""
    if "/" not in state_id:
        return state_id, None
    m = _RECOVERY_ID.fullmatch(state_id)
    if not m:
        raise UsageError(f"state {state_id!r}: a state inside a recovery is ORIGINAL/rN[-...], e.g. p57/r12")
    return m.group(1), "p" + m.group(2)


def join_recovery_id(original: str, recovery_state: str) -> str:
    return f"{original}/r{recovery_state[1:]}"


# Crash points of a recovery log: every entry (a recovery log is short, and
# the recovery-crash budget caps the states anyway).
RECOVERY_POINTS = "write,flush,fua,mark"


def plan_for_recovery_log(reader: LogReader, spec: ReorderSpec) -> CrashPlan:
    """The crash states of a recovery log: it starts from a crash image, so nothing in it is durable up front."""
    entries = list(reader.entries())
    return CrashPlan(entries, reader.sectorsize, select_crash_points(entries, RECOVERY_POINTS), spec, 0)


RECOVERY_LOG_DIR = "recovery-logs"   # in a run's directory: the recovery logs of its findings


def recovery_log_name(original: str, mode: str) -> str:
    """File name of the recovery log of crash state ORIGINAL recovered in MODE (rw, ro)."""
    return f"{original}.{mode}.log"


def kept_recovery_log(log: str, state_id: str) -> str | None:
    """The recovery log a state inside a recovery (ORIGINAL/rN) needs, as a run kept it
    beside LOG; None for a plain state id."""
    original, inner = split_recovery_id(state_id)
    if inner is None:
        return None
    for mode in ("rw", "ro"):  # the names checkers/crashwalk/recovery_crash.py gives them
        path = os.path.join(os.path.dirname(log), RECOVERY_LOG_DIR, recovery_log_name(original, mode))
        if os.path.exists(path):
            return path
    raise UsageError(f"state {state_id!r}: no recovery log for {original} beside {log}; give --recovery-log")
