"""Build crash-state images: the base image at the epoch start plus the state's pieces.

A StateImage holds one crash state at a time and moves to the next by
rewriting only what differs between the two. The image is always the base
(the log replayed through entry E-1, E an epoch start) plus the pieces of
the state on top; what the base held under those pieces is kept aside in
an unnamed file of the same layout. To move to the next state it restores
the base only under the pieces the new state no longer has (a dropped
write, a tear that became whole) and writes, in log order, the new state's
pieces over that and over the pieces it newly has. A state whose epoch starts
later (a flush completed) counts the entries in between as whole pieces on
the old base, and then takes its own epoch start as the new base.

So consecutive states of one epoch (the prefix, each dropped write, each
torn write, the next crash point) cost what they differ by, not the epoch:
an O_DIRECT stream's epoch holds hundreds of MB, and rebuilding it for every
state was ~99 % of a full-scale walk (issue 16). States come in crash-point
order, so the base only moves forward and no state costs a replay from entry 0.
`changed` (track_changes) is every byte range rewritten, so a copy of the
image can follow by copying just those (checkers/crashwalk/slot.py).
"""

from __future__ import annotations

import bisect
import os

from foundation.errors import UsageError
from foundation.intervals import merge_ranges, subtract_ranges
from foundation.ownership import create_file
from foundation.sparse import mirror_range, punch_hole
from replay.crashstates import CrashState, Piece, ReorderSpec, plan_for_log, plan_for_recovery_log, split_recovery_id
from replay.logformat import Closing, LogReader
from replay.replayer import MIRROR_MIN, Replayer

Range = tuple[int, int]


class StateImage(Closing):
    """The file FD, always holding exactly one crash state of READER's log."""

    def __init__(self, reader: LogReader, fd: int, track_changes: bool = False) -> None:
        self.reader = reader
        self.fd = fd
        # Its position is the base's epoch start E: the image is base(E) + _applied.
        self._replayer = Replayer(reader, fd, sparse=True)
        self._applied: dict[int, Piece] = {}        # entry index -> the piece of it on the image
        self._saved: list[Range] = []               # merged byte ranges where _base_fd holds base(E)
        self._base_fd: int | None = None            # (elsewhere the image itself holds base(E))
        self._broken = False
        self.state: CrashState | None = None
        # TRACK_CHANGES: byte ranges (start, end) rewritten since the last take_changed().
        self.changed: list[Range] | None = [] if track_changes else None
        if track_changes:
            self._replayer.on_change = self._note

    def load(self, state: CrashState) -> None:
        if self._broken:
            raise ValueError("a load failed half-way: this image no longer holds a known state")
        self.state, self._broken = None, True
        if not self._applied:   # the image is exactly the base: move it by plain replay
            self._replayer.replay_through(state.epoch_start - 1)
            self._saved, before = [], []
        else:
            before = self._whole_until(state.epoch_start)
        self._move(before, list(state.pieces()))
        self.state, self._broken = state, False

    def _whole_until(self, epoch_start: int) -> list[Piece]:
        """Move the base's position to EPOCH_START; the writes and discards passed over, whole."""
        if epoch_start < self._replayer.position:
            raise ValueError(f"image base is at entry {self._replayer.position}; it cannot go back to {epoch_start}")
        out = []
        while self._replayer.position < epoch_start:
            e = self._replayer.read_next()
            if e is None:
                break
            if (e.is_write or e.is_discard) and e.nr_sectors:
                out.append(Piece(e, e.sector, e.sector + e.nr_sectors))
        return out

    def _move(self, before: list[Piece], pieces: list[Piece]) -> None:
        """From base(E) + _applied to base(E) + BEFORE + PIECES, then rebase past BEFORE."""
        ss, bound = self.reader.sectorsize, self._replayer.device_bytes
        order = before + pieces
        target = {p.entry.index: p for p in order}
        removed = [p for i, p in self._applied.items() if not _same(target.get(i), p)]
        added = [p for p in order if not _same(self._applied.get(p.entry.index), p)]
        for p in added:
            self.reader.check_bounds(p.entry, bound)
        mine = [_bytes(p, ss) for p in pieces]
        # 1. Keep base(E) under the state's new pieces before they overwrite it (BEFORE's
        #    are about to become the base: only where the state's own pieces lie is it needed).
        own = [p for p in added if not before or p.entry.index > before[-1].entry.index]
        fresh = subtract_ranges(merge_ranges([_bytes(p, ss) for p in own]), self._saved)
        for start, end in fresh:
            mirror_range(self.fd, self._base(), start, end)
        self._saved = merge_ranges(self._saved + fresh)
        # 2. Under what the state no longer has, the base; 3. over all of it, the pieces in log order.
        gone = merge_ranges([_bytes(p, ss) for p in removed])
        for start, end in gone:
            mirror_range(self._base(), self.fd, start, end)
        touched = merge_ranges(gone + [_bytes(p, ss) for p in added])
        self._put_all(self.fd, order, touched)
        for start, end in touched:
            self._note(start, end)
        # 4. Rebase: base(E') = base(E) + BEFORE, kept where the state's pieces lie.
        if before:
            self._saved = merge_ranges(mine)
            self._put_all(self._base(), before, self._saved)
        self._applied = {p.entry.index: p for p in pieces}

    def _put_all(self, fd: int, order: list[Piece], ranges: list[Range]) -> None:
        """Write each of ORDER's pieces, in order, where it meets RANGES (sorted, merged)."""
        if not ranges:
            return
        ss, starts = self.reader.sectorsize, [s for s, _ in ranges]
        for p in order:
            a, b = _bytes(p, ss)
            i = max(bisect.bisect_right(starts, a) - 1, 0)
            while i < len(ranges) and ranges[i][0] < b:
                start, end = max(a, ranges[i][0]), min(b, ranges[i][1])
                if start < end:
                    self._put(fd, p, start, end)
                i += 1

    def _put(self, fd: int, piece: Piece, start: int, end: int) -> None:
        """Bytes [START, END) of what PIECE writes, onto FD."""
        entry = piece.entry
        if entry.is_discard:
            punch_hole(fd, start, end - start)
            return
        skip = start - entry.sector * self.reader.sectorsize
        if end - start >= MIRROR_MIN and self.reader.mirror_data(entry, fd, start, skip, end - start):
            return
        os.pwrite(fd, memoryview(self.reader.read_data(entry))[skip:skip + end - start], start)

    def _base(self) -> int:
        """The file keeping base(E) where the image holds pieces: unnamed, beside the image
        (so nothing is left behind however the process ends), the image's size."""
        if self._base_fd is None:
            try:
                where = os.path.dirname(os.readlink(f"/proc/self/fd/{self.fd}"))
                self._base_fd = os.open(where, os.O_TMPFILE | os.O_RDWR, 0o600)
            except OSError:
                self._base_fd = os.memfd_create("powercut-state-base")
            os.ftruncate(self._base_fd, self._replayer.device_bytes)
        return self._base_fd

    def _note(self, start: int, end: int) -> None:
        if self.changed is not None:
            self.changed.append((start, end))

    def take_changed(self) -> list[Range]:
        """The ranges rewritten since the last call (possibly overlapping), and forget them."""
        assert self.changed is not None, "StateImage(track_changes=True) only"
        out, self.changed = self.changed, []
        return out

    def close(self) -> None:
        self._replayer.close()
        if self._base_fd is not None:
            os.close(self._base_fd)
            self._base_fd = None


def _bytes(p: Piece, sectorsize: int) -> Range:
    return p.start * sectorsize, p.stop * sectorsize


def _same(a: Piece | None, b: Piece | None) -> bool:
    return a is not None and b is not None and (a.start, a.stop) == (b.start, b.stop)


def build_crash_image(reader: LogReader, state_id: str, size: int, out: str,
                      recovery_log: str | None = None) -> CrashState:
    """Write the crash image of STATE_ID to OUT, a new file (or one powercut made).
    A state inside a recovery (`p57/r12`) also needs the log of that recovery: the
    image is the original state with the recovery log's state applied on top."""
    original, inner = split_recovery_id(state_id)
    state = plan_for_log(reader, [], ReorderSpec()).state(original)
    if inner is not None and recovery_log is None:
        raise UsageError(f"state {state_id!r} is inside a recovery: give the log of that recovery (--recovery-log)")
    fd = create_file(out, size)
    try:
        with StateImage(reader, fd) as image:
            image.load(state)
        if inner is not None:
            assert recovery_log is not None
            with LogReader(recovery_log) as rec_reader, StateImage(rec_reader, fd) as image:
                state = plan_for_recovery_log(rec_reader, ReorderSpec()).state(inner)
                image.load(state)
        os.fsync(fd)
    finally:
        os.close(fd)
    return state
