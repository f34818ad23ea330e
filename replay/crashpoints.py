"""Which log prefixes are crash points.

Crash point i means: the device lost power right after log entry i
completed, so the crash image is the initial image plus entries 0..i.
Selection is a comma-separated list of kinds (`--crash-points`):
flush, fua, mark, write (every entry carrying data or a discard), or a
number N (every Nth entry). The default, `flush,fua,mark`, is after every
FLUSH or FUA entry and every mark. The last entry is always a crash point.

Crash points start after mkfs (the mark `pc:mkfs-done`; everything before it
is taken as durable) and can be narrowed to a range between two marks
(`--start-mark`, `--end-mark`); the range's last entry is then its end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from foundation.errors import UsageError
from workloads.marks import MARK_MKFS
from replay.logformat import Entry, LogReader
from replay.replayer import find_mark

DEFAULT = "flush,fua,mark"

KINDS: dict[str, Callable[[Entry], bool]] = {
    "flush": lambda e: e.is_flush,
    "fua": lambda e: e.is_fua,
    "mark": lambda e: e.is_mark,
    "write": lambda e: e.is_write or e.is_discard,
}


@dataclass(frozen=True)
class CrashPointSpec:
    """`--crash-points`, parsed: the kinds of entry that are crash points and an every-Nth step (0: none)."""
    text: str = DEFAULT
    kinds: tuple[str, ...] = ("flush", "fua", "mark")
    every: int = 0

    @classmethod
    def parse(cls, spec: str | None) -> CrashPointSpec:
        """SPEC (None or "": the default) checked (UsageError)."""
        text = spec or DEFAULT
        kinds, every = [], 0
        for word in (w.strip() for w in text.split(",")):
            if word in KINDS:
                kinds.append(word)
            elif word.isdigit() and int(word) > 0:
                every = int(word)
            else:
                raise UsageError(f"--crash-points {spec!r}: {word!r} is not one of flush, fua, mark, write or a number > 0")
        return cls(text, tuple(kinds), every)

    def __str__(self) -> str:
        return self.text


def mkfs_done(reader: LogReader) -> int | None:
    """Index of the mkfs-done mark; None in a log not recorded by `powercut run`."""
    try:
        return find_mark(reader, MARK_MKFS)
    except UsageError:
        return None


def first_crash_point(reader: LogReader) -> int:
    """Crash points start at the mkfs-done mark (or at 0 without one)."""
    return mkfs_done(reader) or 0


def mark_range(reader: LogReader, start_mark: str | None, end_mark: str | None) -> tuple[int, int | None]:
    """Entry indices of --start-mark and --end-mark (the first such mark after the start)."""
    first = first_crash_point(reader)
    start = _find(reader, "--start-mark", start_mark, first) if start_mark is not None else first
    end = _find(reader, "--end-mark", end_mark, start) if end_mark is not None else None
    return start, end


def _find(reader: LogReader, option: str, text: str, start: int) -> int:
    try:
        return find_mark(reader, text, start)
    except UsageError:
        raise UsageError(f"{option} {text!r}: no such mark in {reader.path} from entry {start} on") from None


def select_crash_points(entries: Iterable[Entry], spec: CrashPointSpec | str = DEFAULT, first: int = 0,
                        last: int | None = None) -> list[int]:
    """Crash points among entries FIRST..LAST (default: the end) of the log, per SPEC, plus LAST."""
    parsed = spec if isinstance(spec, CrashPointSpec) else CrashPointSpec.parse(spec)
    preds, every = [KINDS[k] for k in parsed.kinds], parsed.every
    points: list[int] = []
    end = -1
    for e in entries:
        if last is not None and e.index > last:
            break
        end = e.index
        if e.index < first:
            continue
        if any(p(e) for p in preds) or (every and (e.index - first) % every == every - 1):
            points.append(e.index)
    if end >= first and (not points or points[-1] != end):
        points.append(end)
    return points


# The default crash-point budget of `powercut run`: every design point plus this many
# others spread evenly. A run with fewer other points checks them all (CI scales, small
# workloads); at --scale 1.0 the recorder scenario's 26918 points (758 design points)
# become 1259, 20 minutes in all with 2 workers here instead of ~6 hours (docs/workloads.md).
DEFAULT_SPREAD = 500
DEFAULT_BUDGET = f"design+{DEFAULT_SPREAD}"
EVERY_POINT = "all"


@dataclass(frozen=True)
class Budget:
    """A crash-point budget (`--max-states`): at most N points, design points always
    (N), or every design point plus at most N others spread evenly (design+N)."""
    n: int
    design_plus: bool = False

    def choose(self, points: list[int], must: set[int]) -> list[int]:
        if not points:
            return []
        kept = len(set(must) & set(points) | {points[-1]})  # budget_points always keeps these
        return budget_points(points, must, kept + self.n if self.design_plus else self.n)

    def __str__(self) -> str:
        return f"design+{self.n}" if self.design_plus else str(self.n)


def parse_budget(spec: int | str | None) -> Budget | None:
    """`--max-states`: `all` or 0 (every crash point: None), N (at most N points, design
    points always), or `design+N` (every design point plus N spread evenly). UsageError."""
    text = str(spec if spec is not None else EVERY_POINT).strip()
    if text in (EVERY_POINT, "0"):
        return None
    plus = text.startswith("design+")
    num = text[len("design+"):] if plus else text
    if not num.isdigit() or (not plus and int(num) == 0):
        raise UsageError(f"--max-states {text}: give a number of crash points, design+N or {EVERY_POINT}")
    return Budget(int(num), plus)


def budget_points(points: list[int], must: Iterable[int], budget: int) -> list[int]:
    """At most BUDGET of POINTS (sorted), plus every point in MUST and the last one:
    the must-points first, the rest of the budget spread evenly over the others.
    Fewer points than the budget: all of them."""
    if budget <= 0 or len(points) <= budget:
        return list(points)
    keep = set(must) & set(points) | {points[-1]}
    others = [p for p in points if p not in keep]
    room = budget - len(keep)
    if room > 0 and others:
        step = len(others) / room
        keep |= {others[min(len(others) - 1, int(k * step + step / 2))] for k in range(room)}
    return sorted(keep)
