"""Untorn writes at a crash state: does a write's range hold all of its
data, or none of it?

A write's range [start, end) (clipped to the recovered file's length) is cut
in 512-byte pieces on the pattern's chunk grid, the finest unit a device
tears (replay/crashstates.py). A piece is *new* when it holds the write's
own bytes, *old* when it holds neither them nor what a newer writer put
there. Newer writers are the file's other data, zero and maybe events
allowed at the crash point whose op had not returned before this one
started (later ops, and concurrent ones whose order the kernel chose). A
write with new and old pieces is torn: the finding `atomicity` when it was
an RWF_ATOMIC write (rule untorn-write), a count in the report otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from checkers.eventindex import PlainEvents, PointEvents
from checkers.history import History
from checkers.timeline import DataEvent, Exec
from foundation.intervals import merge_ranges
from workloads.pattern import CHUNK, decode_chunk, generate

# Kinds whose writes are classified at every crash state (cheap: these ops are
# rare in random workloads and what the torn-pages scenario issues).
CLASSIFIED_KINDS = frozenset({"pwritev2"})


@dataclass
class WriteVerdict:
    ex: Exec
    event: DataEvent
    new: list[tuple[int, int]] = field(default_factory=list)   # ranges holding this write's data
    old: list[tuple[int, int]] = field(default_factory=list)   # ranges holding neither it nor newer data
    old_writers: list[str] = field(default_factory=list)       # what the first old pieces hold

    @property
    def torn(self) -> bool:
        return bool(self.new and self.old)

    @property
    def untorn_promised(self) -> bool:
        return self.event.untorn


def _newer(h: History, e: DataEvent, overlapping: list[DataEvent]) -> list[DataEvent]:
    """Of the allowed data, zero and maybe events OVERLAPPING E's range, the newer writers."""
    started = h.execs[e.pos].rec.start_ns
    return [o for o in overlapping if o is not e and (o.kind == "maybe" or h.execs[o.pos].rec.end_ns >= started)]


def _want(wid: int, e: DataEvent, a: int, b: int) -> bytes:
    if e.src is None:
        return bytes(b - a)
    return generate(wid, e.src.file_id, e.src.seq, e.src.iter, a - e.src.delta, b - a)


def _describe(piece: bytes) -> str:
    if not any(piece):
        return "zeros"
    info = decode_chunk(piece) if len(piece) == CHUNK else None
    if info is None:
        return "data without a valid chunk header"
    return f"op {info.seq} iter {info.iter} (written for offset {info.offset})"


def classify(h: History, wid: int, e: DataEvent, overlapping: list[DataEvent], data: bytes) -> WriteVerdict:
    """Which pieces of E's range in DATA (the file as recovered) are new, which old.
    OVERLAPPING: the allowed data, zero and maybe events overlapping E's range."""
    v = WriteVerdict(h.execs[e.pos], e)
    end = min(e.end, len(data))
    newer = _newer(h, e, overlapping)
    a = e.start
    while a < end:
        b = min(end, (a // CHUNK + 1) * CHUNK)
        got = data[a:b]
        mine = _want(wid, e, a, b)
        over = [o for o in newer if o.start < b and o.end > a]
        if got == mine:
            v.new.append((a, b))
        elif not over:
            v.old.append((a, b))
            if len(v.old_writers) < 4:
                v.old_writers.append(f"{a}..{b}: {_describe(got)}")
        else:  # a newer writer covers part of the piece: byte by byte
            ok_new = ok_old = False
            newer_bytes = [(max(o.start, a), min(o.end, b), _want(wid, o, max(o.start, a), min(o.end, b)))
                           for o in over]
            for i in range(b - a):
                x = a + i
                if any(s <= x < t and got[i] == w[x - s] for s, t, w in newer_bytes):
                    continue
                if got[i] == mine[i]:
                    ok_new = True
                else:
                    ok_old = True
            if ok_old:
                v.old.append((a, b))
                if len(v.old_writers) < 4:
                    v.old_writers.append(f"{a}..{b}: {_describe(got)}")
            elif ok_new:
                v.new.append((a, b))
        a = b
    v.new, v.old = merge_ranges(v.new), merge_ranges(v.old)
    return v


def classified(h: History) -> Callable[[DataEvent], bool]:
    """Whether a data event's write is classified at every crash state."""
    return lambda e: e.untorn or e.batch is not None or h.execs[e.pos].kind in CLASSIFIED_KINDS


def classify_file(h: History, wid: int, events: PointEvents | PlainEvents, data: bytes) -> list[WriteVerdict]:
    """Every classified write allowed at the crash point. EVENTS: the inode's events
    at that point (checkers/eventindex.py PointEvents or PlainEvents)."""
    return [classify(h, wid, e, events.overlapping(e.start, e.end), data) for e in events.classified()]


def summarize_torn(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """report.json `torn_writes`: over the crash states that had classified
    writes, how many states showed a torn one, how many torn writes at most
    and in all, the untorn (RWF_ATOMIC) ones apart; the torn states listed."""
    rows = sorted(rows, key=lambda r: (r["crash_point"], r["state_id"]))
    torn = [r for r in rows if r["torn"]]
    return {"states": len(rows), "states_torn": len(torn),
            "torn_total": sum(r["torn"] for r in rows), "torn_max": max((r["torn"] for r in rows), default=0),
            "untorn_writes_max": max((r["writes_untorn"] for r in rows), default=0),
            "torn_untorn_total": sum(r["torn_untorn"] for r in rows),
            "torn_per_state": {str(n): sum(r["torn"] == n for r in rows) for n in sorted({r["torn"] for r in rows})},
            "torn_states": [{k: r[k] for k in ("state_id", "torn", "torn_untorn", "torn_ops")} for r in torn[:50]]}
