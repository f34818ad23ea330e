"""Which log prefixes are crash points.

Crash point i means: the device lost power right after log entry i
completed, so the crash image is the initial image plus entries 0..i.
Selection is a comma-separated list of kinds (`--crash-points`):
flush, fua, mark, write (every entry carrying data or a discard), or a
number N (every Nth entry). The default, `flush,fua,mark`, is after every
FLUSH or FUA entry and every mark. The last entry is always a crash point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from harness.errors import UsageError
from replay.logformat import Entry

DEFAULT = "flush,fua,mark"

KINDS: dict[str, Callable[[Entry], bool]] = {
    "flush": lambda e: e.is_flush,
    "fua": lambda e: e.is_fua,
    "mark": lambda e: e.is_mark,
    "write": lambda e: e.is_write or e.is_discard,
}


def parse_spec(spec: str) -> tuple[list[Callable[[Entry], bool]], int]:
    """Turn SPEC into entry predicates and an every-Nth step (0: none)."""
    preds, every = [], 0
    for word in (w.strip() for w in (spec or DEFAULT).split(",")):
        if word in KINDS:
            preds.append(KINDS[word])
        elif word.isdigit() and int(word) > 0:
            every = int(word)
        else:
            raise UsageError(f"--crash-points {spec!r}: {word!r} is not one of flush, fua, mark, write or a number > 0")
    return preds, every


def select_crash_points(entries: Iterable[Entry], spec: str = DEFAULT, first: int = 0) -> list[int]:
    """Crash points among entries FIRST.. of the log, per SPEC, plus the end."""
    preds, every = parse_spec(spec)
    points: list[int] = []
    last = -1
    for e in entries:
        last = e.index
        if e.index < first:
            continue
        if any(p(e) for p in preds) or (every and (e.index - first) % every == every - 1):
            points.append(e.index)
    if last >= first and (not points or points[-1] != last):
        points.append(last)
    return points
