"""Apply a dm-log-writes log to a target image, one entry at a time.

What an entry does to the target (verified against xfstests
src/log-writes/log-writes.c, log_replay_next_entry and log_discard):

- a write (nr_sectors > 0, no DISCARD flag, whatever else its flags say: a
  FLUSH or MARK entry with data writes it too) puts its nr_sectors *
  sectorsize bytes at sector * sectorsize;
- a discard zeroes its range. replay-log issues BLKDISCARD, and on a target
  that cannot discard (a regular file: BLKDISCARD fails) writes zeros instead,
  in chunks of at most 1 GiB, leaving alone every chunk larger than 128 MiB
  (log_open's max_zero_size). The crash walk always zeroes the whole range (a
  punched hole is cheap at any size); `zero_limit` gives replay-log's rule;
- flushes and marks without data change nothing;
- replay-log's --start-sector/--end-sector (log_should_skip): an entry with
  data that ends at or before the start sector, or begins after the end
  sector, is skipped; entries without sectors and discards (tested before
  the skip) are never skipped.

Entries are applied strictly in log order; the target only moves forward.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from foundation.errors import UsageError
from foundation.ownership import create_file, require_owned
from foundation.sparse import first_difference, punch_hole, pwrite_sparse
from replay.logformat import Closing, Entry, LogReader


# replay-log's zeroing of a discard on a target that cannot discard (log-writes.c).
DISCARD_CHUNK = 1 << 30
XFSTESTS_ZERO_LIMIT = 128 << 20
ALL_SECTORS = (0, (1 << 64) - 1)
# Writes at least this large go from the log to a sparse target in the kernel, the log's
# holes as holes (mkfs.xfs zeroes its 64 MiB log: read, compared and punched per worker,
# that was ~60 ms of CPU); smaller ones are cheaper read and written.
MIRROR_MIN = 1 << 20


class Replayer(Closing):
    """Replays READER's entries onto a target, never going back.

    TARGET is a path (which powercut must have created; opened and closed
    here) or an open fd (left open). Its size at construction is the device
    size every entry is bounds-checked against. With SPARSE, all-zero writes
    become holes. SECTORS (first, last; log sectors) limits which writes are
    applied; ZERO_LIMIT leaves alone a discard chunk larger than that, and
    ON_ZERO_SKIPPED hears of each such chunk's length.
    """

    def __init__(self, reader: LogReader, target: str | int, *, discard: bool = True, sparse: bool = False,
                 sectors: tuple[int, int] = ALL_SECTORS, zero_limit: int | None = None,
                 on_zero_skipped: Callable[[int], None] | None = None) -> None:
        self.reader = reader
        self.discard = discard
        self.sectors = sectors
        self.zero_limit = zero_limit
        self._on_zero_skipped = on_zero_skipped
        self._write = pwrite_sparse if sparse else os.pwrite
        self._sparse = sparse
        if isinstance(target, int):
            self.fd, self._owns_fd = target, False
        else:
            require_owned(target, "replay onto")
            self.fd, self._owns_fd = os.open(target, os.O_RDWR | os.O_NOFOLLOW), True
        self.device_bytes = os.lseek(self.fd, 0, os.SEEK_END)
        self._entries: Iterator[Entry] = reader.entries()
        self._position = 0
        self.on_change: Callable[[int, int], None] | None = None  # hears (start, end) of every range it changes

    @property
    def position(self) -> int:
        """Index of the next entry to apply (= entries applied or skipped so far)."""
        return self._position

    def _next(self) -> Entry | None:
        entry = next(self._entries, None)
        if entry is not None:
            self._position += 1
        return entry

    def apply_next(self) -> Entry | None:
        """Apply the entry at `position` and return it; None at the end of the log."""
        entry = self.read_next()
        if entry is not None:
            self.apply(entry)
        return entry

    def read_next(self) -> Entry | None:
        """The entry at `position`, passed over without applying it (call `apply` for that)."""
        return self._next()

    def skips(self, entry: Entry) -> bool:
        """Outside `sectors`: replay-log's log_should_skip (entries without sectors never are)."""
        first, last = self.sectors
        return entry.nr_sectors > 0 and (entry.sector + entry.nr_sectors <= first or entry.sector > last)

    def apply(self, entry: Entry) -> None:
        if entry.is_discard and not self.discard:
            return
        if not entry.is_discard and self.skips(entry):
            return
        self.reader.check_bounds(entry, self.device_bytes)
        start, end = entry.byte_range(self.reader.sectorsize)
        if self.on_change is not None and end > start:
            self.on_change(start, end)
        if entry.is_write:
            if self._sparse and end - start >= MIRROR_MIN and self.reader.mirror_data(entry, self.fd, start):
                return
            self._write(self.fd, self.reader.read_data(entry), start)
        elif entry.is_discard and end > start:
            self._zero(start, end)

    def _zero(self, start: int, end: int) -> None:
        if self.zero_limit is None:
            punch_hole(self.fd, start, end - start)
            return
        for chunk in range(start, end, DISCARD_CHUNK):
            length = min(DISCARD_CHUNK, end - chunk)
            if length > self.zero_limit:
                if self._on_zero_skipped:
                    self._on_zero_skipped(length)
            else:
                punch_hole(self.fd, chunk, length)

    def skip_to(self, index: int) -> None:
        """Move to INDEX (at most nr_entries) without applying the entries before it."""
        self._require_forward(index)
        if index > self.reader.nr_entries:
            raise self._no_entry(index)
        while self._position < index:
            self._next()

    def replay_through(self, index: int) -> None:
        """Apply the entries from `position` up to and including INDEX."""
        self._require_forward(index + 1)
        if index >= self.reader.nr_entries:
            raise self._no_entry(index)
        while self._position <= index:
            self.apply_next()

    def _require_forward(self, position: int) -> None:
        # Going back would mean replaying from 0 onto a fresh image: the
        # caller's job, not something to do behind its back.
        if position < self._position:
            raise ValueError(f"replayer is at entry {self._position}; it cannot go back to {position}")

    def _no_entry(self, index: int) -> UsageError:
        return UsageError(f"{self.reader.path}: no entry {index} (the log has {self.reader.nr_entries})")

    def fsync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        if self._owns_fd and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


def find_mark(reader: LogReader, text: str, start: int = 0) -> int:
    """Index of the first MARK entry at or after START whose text is TEXT."""
    for entry in reader:
        if entry.index >= start and entry.is_mark and entry.mark == text:
            return entry.index
    raise UsageError(f"{reader.path}: no mark {text!r} in the log")


def log_differs_from(reader: LogReader, image: str, scratch: str) -> int | None:
    """Where the whole log, replayed onto a zeroed device the size of IMAGE, differs from IMAGE
    (a SYNC_CHUNK-aligned byte offset), or None if it rebuilds IMAGE exactly. SCRATCH is a
    new file for the replay, removed afterwards."""
    fd = create_file(scratch)
    try:
        with open(image, "rb") as img:
            size = os.fstat(img.fileno()).st_size
            os.ftruncate(fd, size)
            with Replayer(reader, fd, sparse=True) as replayer:
                if reader.nr_entries:
                    replayer.replay_through(reader.nr_entries - 1)
            return first_difference(img.fileno(), fd, size)
    finally:
        os.close(fd)
        os.unlink(scratch)
