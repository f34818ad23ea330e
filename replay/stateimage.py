"""Build crash-state images: the base image at the epoch start plus the state's pieces.

A StateImage holds one crash state at a time and moves to the next by
deltas: it undoes the previous state's pieces (their old bytes were saved),
replays the log forward to the new epoch start and applies the new pieces.
States come in crash-point order, so the base only moves forward and no
state costs a replay from entry 0.
"""

from __future__ import annotations

import os

from harness.foundation.ownership import create_file
from harness.foundation.errors import UsageError
from replay.crashstates import CrashState, ReorderSpec, plan_for_log, plan_for_recovery_log, split_recovery_id
from replay.logformat import Closing, LogReader
from harness.foundation.sparse import punch_hole, pwrite_sparse
from replay.replayer import Replayer


class StateImage(Closing):
    """The file FD, always holding exactly one crash state of READER's log."""

    def __init__(self, reader: LogReader, fd: int, track_changes: bool = False) -> None:
        self.reader = reader
        self.fd = fd
        self._replayer = Replayer(reader, fd, sparse=True)
        self._undo: list[tuple[int, bytes]] = []
        self.state: CrashState | None = None
        # TRACK_CHANGES: byte ranges (start, end) rewritten since the last take_changed().
        self.changed: list[tuple[int, int]] | None = [] if track_changes else None
        if track_changes:
            self._replayer.on_change = self._note

    def load(self, state: CrashState) -> None:
        self._restore()
        self._replayer.replay_through(state.epoch_start - 1)
        ss = self.reader.sectorsize
        for piece in state.pieces():
            self.reader.check_bounds(piece.entry, self._replayer.device_bytes)
            offset, length = piece.start * ss, (piece.stop - piece.start) * ss
            self._undo.append((offset, os.pread(self.fd, length, offset)))
            self._note(offset, offset + length)
            if piece.entry.is_discard:
                punch_hole(self.fd, offset, length)
            else:
                skip = (piece.start - piece.entry.sector) * ss
                os.pwrite(self.fd, memoryview(self.reader.read_data(piece.entry))[skip:skip + length], offset)
        self.state = state

    def _restore(self) -> None:
        while self._undo:
            offset, old = self._undo.pop()
            pwrite_sparse(self.fd, old, offset)
            self._note(offset, offset + len(old))
        self.state = None

    def _note(self, start: int, end: int) -> None:
        if self.changed is not None:
            self.changed.append((start, end))

    def take_changed(self) -> list[tuple[int, int]]:
        """The ranges rewritten since the last call (possibly overlapping), and forget them."""
        assert self.changed is not None, "StateImage(track_changes=True) only"
        out, self.changed = self.changed, []
        return out

    def close(self) -> None:
        self._replayer.close()


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
