"""One inode's allowed sizes and bytes at a crash point, checked against given bytes (no I/O).

The bulk path (bulk_ok over a ChunkScan) accepts whole chunks by two
sufficient conditions and leaves the rest to the sector-by-sector
reference (sector_ok): the two must agree (tests/test_oracle_bulk.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from checkers.findings import Finding
from checkers.fsrules import rule
from checkers.oracle.model import Model
from checkers.oracle.view import PointView
from checkers.timeline import Inode
from checkers.untorn import WriteVerdict, classify_file
from foundation.intervals import Piece, Src, merge_ranges, subtract_ranges
from workloads.pattern import CHUNK, ChunkScan, decode_chunk, generate

ZERO_CHUNK = bytes(CHUNK)


class FileCheck:
    """One inode's allowed sizes and bytes at a crash point, checked against a file's content."""

    def __init__(self, model: Model, ino: Inode, v: PointView) -> None:
        self.o = model
        self.ino = ino
        self.v = v
        self.g = model.guarantee(ino, v)
        floor = self.g.floor if self.g else -1
        # the allowed events (`history`), those at or after the floor (`later`): by index, not a walk
        self.events = model.index.point_events(ino, v, floor)
        self.shifted = bool(self.events.later_of("collapse") or self.events.later_of("insert"))
        self.verdicts: list[WriteVerdict] = []  # the classified writes (checkers/untorn.py), once checked
        # failed writes that may have left bytes behind (allowed at any time after they ran),
        # other orders of ops the marks do not order (checkers/overlap.py)
        self.maybe = self.events.maybes()
        self._zeroed: list[tuple[int, int]] | None = None

    def zeroed(self) -> list[tuple[int, int]]:
        """The ranges `later` zero events cover."""
        if self._zeroed is None:
            self._zeroed = [(e.start, e.end) for e in self.events.later_of("zero")]
        return self._zeroed

    def size_range(self) -> tuple[int, int]:
        later = self.events.later_sizes()
        sizes = list(later) if later else []
        top = max([e.end for e in self.maybe if e.src is not None], default=0)  # a failed write past EOF: not ruled out
        if self.g is None:
            return 0, max(sizes + [top])
        sizes.append(self.g.size)
        # a truncate that may have come last: its size (an empty maybe event, checkers/overlap.py)
        other = [e.size for e in self.maybe if e.src is None and e.start == e.end]
        return min(sizes + other), max(sizes + [top])

    def check(self, data: bytes, scan: ChunkScan | None = None) -> Finding | None:
        """The first sector (by offset) no allowed state explains, as a finding.
        With SCAN (the bulk check), whole chunks that bulk_ok() accepts are not
        looked at one by one: it accepts only what sector_ok() accepts."""
        if self.shifted:
            return None  # ranges moved after the last guarantee: not modelled precisely
        lo, hi = self.size_range()
        size = len(data)
        if size < lo:
            return self.finding("durability", f"size {size}, but {self.g.persist.ex.describe()} "  # type: ignore[union-attr]
                                f"made size {self.g.size} durable and no later op shrank it below {lo}",  # type: ignore[union-attr]
                                expected=f"size in [{lo}, {hi}]", found=f"size {size}")
        offsets: Iterable[int] = range(0, size, CHUNK)
        if scan is not None:
            suspects = np.flatnonzero(~self.bulk_ok(scan)).tolist() + ([scan.n] if size % CHUNK else [])
            offsets = [c * CHUNK for c in suspects]
        for off in offsets:
            sector = data[off:off + CHUNK]
            if not self.sector_ok(off, sector):
                return self.sector_finding(off, sector)
        if size > hi and any(data[hi:]):
            return self.finding("stale-data", f"size {size} is larger than the file ever was ({hi}) and holds data there",
                                expected=f"size <= {hi}", found=f"size {size}")
        self.verdicts = classify_file(self.o.h, self.o.wid, self.events, data)
        torn = next((w for w in self.verdicts if w.torn and w.untorn_promised), None)
        if torn and self.o.semantics.holds("untorn-write"):
            return self.untorn_finding(torn)
        return self.batch_finding() if self.o.semantics.holds("f2fs-atomic-write") else None

    def batch_finding(self) -> Finding | None:
        """An f2fs atomic batch (checkers/f2fs_batches.py) with some of its writes' pieces
        in the file and some not: half a committed batch."""
        batches: dict[int, list[WriteVerdict]] = {}
        for w in self.verdicts:
            if w.event.batch is not None:
                batches.setdefault(w.event.batch, []).append(w)
        for start, ws in sorted(batches.items()):
            new = [(w, s, t) for w in ws for s, t in w.new]
            old = [(w, s, t) for w in ws for s, t in w.old]
            if not (new and old):
                continue
            r = rule("f2fs-atomic-write")
            commit = ws[0].ex
            span = lambda xs: ", ".join(f"{s}..{t} (op {w.event.src.seq if w.event.src else '?'})"  # noqa: E731
                                        for w, s, t in xs[:6])
            return Finding("atomicity", f"half of the f2fs atomic batch committed by {commit.describe()} "
                           f"is in the file: {span(new)} hold its data, {span(old)} older data ({r.promise})",
                           evidence={"rule": r.name, "op": commit.describe(), "op_mark": commit.mark,
                                     "batch_start": self.o.h.execs[start].describe(),
                                     "new_ranges": [[s, t] for _, s, t in new], "old_ranges": [[s, t] for _, s, t in old],
                                     "writers": {"old": [x for w, _, _ in old for x in w.old_writers][:4]},
                                     "expected": "all of the batch's writes, or none of them",
                                     "found": f"new {span(new)}; old {span(old)}",
                                     "offset": old[0][1], "reference": r.reference})
        return None

    def untorn_finding(self, w: WriteVerdict) -> Finding:
        e = w.event
        span = lambda rs: ", ".join(f"{s}..{t}" for s, t in rs)  # noqa: E731
        r = rule("untorn-write")
        return Finding("atomicity", f"bytes {e.start}..{e.end} of {w.ex.describe()} are torn: "
                       f"{span(w.new)} hold its data, {span(w.old)} older data ({r.promise})",
                       evidence={"rule": r.name, "op": w.ex.describe(), "op_mark": w.ex.mark,
                                 "range": [e.start, e.end], "new_ranges": w.new, "old_ranges": w.old,
                                 "writers": {"new": f"op {e.src.seq} iter {e.src.iter}" if e.src else "zeros",
                                             "old": w.old_writers},
                                 "expected": f"all of {e.start}..{e.end} from op {e.src.seq if e.src else '?'}, or none of it",
                                 "found": f"new {span(w.new)}; old {span(w.old)}",
                                 "offset": w.old[0][0], "reference": r.reference})

    # -- all whole chunks at once ----------------------------------------------------
    def bulk_ok(self, scan: ChunkScan) -> np.ndarray:
        """Per whole chunk, True where sector_ok() is sure to hold, by two sufficient
        conditions: the chunk is exactly the content after the completed ops
        (whole chunks of one writer: header and CRC), or all zeros where
        zero_ok() holds. Everything else is left to sector_ok()."""
        n = scan.n
        expect, exp = self.o.index.expected_chunks(self.ino, self.v.n_done, n)
        h = scan.heads
        writer = expect & scan.valid & (h["wid"] == self.o.wid)
        for name in ("file_id", "seq", "iter", "offset"):
            writer &= h[name].astype(np.int64) == exp[name]
        # zero_ok(): zeros are allowed unless guaranteed data not zeroed later is there.
        zero = scan.zero.copy()
        durable = [(s, t) for s, t, _ in self.durable_pieces(0, n * CHUNK) or ()]
        zeroed = merge_ranges(self.zeroed())
        for s, t in subtract_ranges(merge_ranges(durable), zeroed):
            zero[s // CHUNK:-(-t // CHUNK)] = False
        return writer | zero

    # -- one sector -----------------------------------------------------------------
    def guaranteed_parts(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) the guarantee covers."""
        if self.g is None:
            return []
        return merge_ranges([(max(s, start), min(t, end)) for s, t in self.g.ranges if s < end and t > start])

    def durable_pieces(self, start: int, end: int) -> list[Piece] | None:
        """Guaranteed content of [start, end) (zeros omitted), None: no guarantee there."""
        parts = self.guaranteed_parts(start, end)
        if not parts:
            return None
        return [pc for s, t in parts for pc in self.g.content.get(s, t)]  # type: ignore[union-attr]

    def zero_ok(self, start: int, end: int) -> bool:
        pieces = self.durable_pieces(start, end)
        if not pieces:
            return True
        zeros = self.zeroed()
        return all(covered(s, t, zeros) for s, t, _ in pieces)

    def sector_ok(self, off: int, sector: bytes) -> bool:
        end = off + len(sector)
        if sector == ZERO_CHUNK[:len(sector)]:
            if self.zero_ok(off, end):
                return True
        elif len(sector) == CHUNK:
            info = decode_chunk(sector)
            if info is not None and info.wid == self.o.wid and self.whole_writer_ok(off, info):
                return True
        return self.bytes_ok(off, sector, self.allowed_layers(off, end, strict=True))

    def whole_writer_ok(self, off: int, info: Any) -> bool:
        """A whole chunk of one writer: allowed if that writer's allowed write covers the sector."""
        key = (info.file_id, info.seq, info.iter)
        for e in self.events.writer_events(key):
            if e.start <= off and off + CHUNK <= e.end and off - e.src.delta == info.offset:
                return True
        for s, t, src in self.durable_pieces(off, off + CHUNK) or ():
            if (src.file_id, src.seq, src.iter) == key and s <= off and off + CHUNK <= t and off - src.delta == info.offset:
                return True
        return False

    def allowed_layers(self, start: int, end: int, strict: bool) -> list[list[tuple[int, int, Src | None]]]:
        """Layers of candidate content for [start, end): each byte may come from any
        layer covering it. STRICT: the guarantee applies; else any past content."""
        parts = self.guaranteed_parts(start, end) if strict else []
        # Outside the guarantee anything goes back to zeros; inside, the
        # guaranteed content (holes are zeros).
        base: list[tuple[int, int, Src | None]] = []
        cur = start
        for s, t in parts:
            if s > cur:
                base.append((cur, s, None))
            covered_to = s
            for a, b, src in self.g.content.get(s, t):  # type: ignore[union-attr]
                if a > covered_to:
                    base.append((covered_to, a, None))
                base.append((a, b, src))
                covered_to = b
            if covered_to < t:
                base.append((covered_to, t, None))
            cur = t
        if cur < end:
            base.append((cur, end, None))
        layers = [base]
        for e in self.events.layer_events(start, end, strict):
            layers.append([(max(e.start, start), min(e.end, end), e.src)])
        return layers

    def bytes_ok(self, off: int, sector: bytes, layers: list[list[tuple[int, int, Src | None]]]) -> bool:
        return all(self._matched(off, sector, layers))

    def unmatched(self, off: int, sector: bytes) -> list[tuple[int, int, Src | None]]:
        """The pieces of the allowed content for SECTOR (at file offset OFF) that it does not
        hold, each with its source (None: zeros): where a sector that is not one whole pattern
        chunk (a small write, a file's tail) went wrong, which its first offset alone does not say."""
        layers = self.allowed_layers(off, off + len(sector), strict=True)
        ok = self._matched(off, sector, layers)
        return [(s, t, src) for s, t, src in layers[0] if not all(ok[s - off:t - off])]

    def _matched(self, off: int, sector: bytes, layers: list[list[tuple[int, int, Src | None]]]) -> bytearray:
        """Per byte of SECTOR: 1 where some layer's content there is what it holds."""
        ok = bytearray(len(sector))
        for layer in layers:
            for s, t, src in layer:
                want = bytes(t - s) if src is None else generate(self.o.wid, src.file_id, src.seq, src.iter,
                                                                 s - src.delta, t - s)
                got = sector[s - off:t - off]
                for i, (a, b) in enumerate(zip(got, want)):
                    if a == b:
                        ok[s - off + i] = 1
        return ok

    def sector_finding(self, off: int, sector: bytes) -> Finding:
        end = off + len(sector)
        old = self.bytes_ok(off, sector, self.allowed_layers(off, end, strict=False)) or sector == ZERO_CHUNK[:len(sector)]
        bad = self.unmatched(off, sector) if decode_chunk(sector) is None else []
        pieces = [f"{s}..{t} not {'zeros' if src is None else f'op {src.seq}'}" for s, t, src in bad[:4]]
        where = f" ({', '.join(pieces)}{', ...' if len(bad) > 4 else ''})" if bad else ""
        if old and self.g is not None and self.durable_pieces(off, end) is not None:
            return self.finding("durability", f"bytes {off}..{end}{where} are older than what "
                                f"{self.g.persist.ex.describe()} made durable",
                                expected=self.describe_expected(off, end), found=describe_bytes(sector), offset=off,
                                hexdump=hexdump(sector))
        info = decode_chunk(sector) if len(sector) == CHUNK else None
        what = (f"a chunk written by op {info.seq} iter {info.iter} at file offset {info.offset} of pattern file "
                f"{info.file_id}" if info else "data that no op wrote there")
        return self.finding("stale-data", f"bytes {off}..{end}{where} hold {what}",
                            expected=self.describe_expected(off, end), found=describe_bytes(sector), offset=off,
                            hexdump=hexdump(sector), rule_name="no-stale-data")

    def describe_expected(self, start: int, end: int) -> str:
        names = []
        for layer in self.allowed_layers(start, end, strict=True):
            for s, t, src in layer:
                names.append(f"{s}..{t}: " + ("zeros" if src is None else f"op {src.seq} iter {src.iter}"))
        return "; ".join(dict.fromkeys(names))

    def finding(self, kind: str, detail: str, *, expected: str, found: str, rule_name: str | None = None,
                **extra: Any) -> Finding:
        r = rule_name or (self.g.persist.rule if self.g else "no-stale-data")
        ev: dict[str, Any] = {"rule": r, "expected": expected, "found": found, "reference": rule(r).reference, **extra}
        if self.g is not None:
            ev["op"] = self.g.persist.ex.describe()
            ev["op_mark"] = self.g.persist.ex.mark
        return Finding(kind, detail, evidence=ev)


def covered(start: int, end: int, ranges: Iterable[tuple[int, int]]) -> bool:
    """Whether the union of RANGES covers [start, end)."""
    cur = start
    for s, t in sorted(ranges):
        if s > cur:
            break
        cur = max(cur, t)
        if cur >= end:
            return True
    return cur >= end


def describe_bytes(b: bytes) -> str:
    if not any(b):
        return "zeros"
    info = decode_chunk(b) if len(b) == CHUNK else None
    if info:
        return f"chunk of op {info.seq} iter {info.iter}, pattern file {info.file_id}, written for offset {info.offset}"
    return "data without a valid chunk header"


def hexdump(b: bytes, n: int = 64) -> str:
    return " ".join(f"{x:02x}" for x in b[:n])
