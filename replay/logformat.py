"""The dm-log-writes on-disk log: reading it, validating it, writing it.

Layout (verified against Linux drivers/md/dm-log-writes.c and xfstests
src/log-writes/log-writes.h; all fields little-endian):

- Block 0 is the super block: magic u64, version u64, nr_entries u64,
  sectorsize u32 (28 bytes), zero padding to `sectorsize`. The kernel copies
  `sizeof(struct log_write_super)` (32 with alignment) from the stack, so bytes
  28..31 may hold garbage: they are never checked here.
- Entries start at byte `sectorsize`. Each is one header block (sector u64,
  nr_sectors u64, flags u64, data_len u64, then for a MARK the text, then
  zeros up to `sectorsize`), followed by `nr_sectors * sectorsize` bytes of
  data unless the entry is a DISCARD (a discard logs only its header).
  `sector` and `nr_sectors` are in `sectorsize` units, not 512-byte sectors.
- data_len is only the MARK text length (kernel: strlen of the text, which is
  cut to sectorsize - 32 - 1 bytes, so a zero byte always follows it). For
  writes the kernel stores data_len = 0 and the data length comes from
  nr_sectors alone; xfstests' replay-log likewise sizes data only from
  nr_sectors and uses data_len only to bound the mark comparison.
- A mark has sector = 0, nr_sectors = 0, flags = MARK. An empty flush has
  sector = 0 (the empty bio's sector), nr_sectors = 0, flags = FLUSH.
- The kernel rewrites the super block (nr_entries) only after an entry with
  FUA or MARK, and removing the target logs the mark "dm-log-writes-end". A
  log whose recorder stopped early can hold more entries than nr_entries;
  replay-log reads exactly nr_entries entries and so do we.
- replay-log's sanity check (log_entry_valid), repeated here: an entry with
  flags == 0 and nr_sectors == 0 is malformed (reading zeroed space), and an
  entry whose flags are not exactly MARK must have a zero byte right after the
  32-byte header (its header block is zero padded).
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from foundation.errors import UsageError
from foundation.ownership import create_file
from foundation.sparse import mirror_range

MAGIC = 0x6A736677736872
VERSION = 1

FLUSH = 1
FUA = 2
DISCARD = 4
MARK = 8
METADATA = 16

END_MARK = "dm-log-writes-end"

SUPER = struct.Struct("<QQQI")
HEADER = struct.Struct("<QQQQ")

MIN_SECTORSIZE = 512
MAX_SECTORSIZE = 65536

# Order and spelling follow xfstests' entry_flags_to_str.
_FLAG_NAMES = ((FLUSH, "FLUSH"), (FUA, "FUA"), (DISCARD, "DISCARD"), (MARK, "MARK"), (METADATA, "METADATA"))


def flags_str(flags: int) -> str:
    """Human-readable flags, e.g. "FLUSH|FUA|METADATA"; "NONE" for 0."""
    names = [name for bit, name in _FLAG_NAMES if flags & bit]
    unknown = flags & ~sum(bit for bit, _ in _FLAG_NAMES)
    if unknown:
        names.append(f"UNKNOWN.0x{unknown:x}")
    return "|".join(names) or "NONE"


def valid_sectorsize(sectorsize: int) -> bool:
    return MIN_SECTORSIZE <= sectorsize <= MAX_SECTORSIZE and sectorsize & (sectorsize - 1) == 0


def max_mark_bytes(sectorsize: int) -> int:
    """Longest mark text the kernel keeps (kstrndup to sectorsize - 32 - 1)."""
    return sectorsize - HEADER.size - 1


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry. Offsets are byte offsets in the log file."""

    index: int
    sector: int
    nr_sectors: int
    flags: int
    data_len: int
    mark: str | None
    header_offset: int
    data_offset: int

    @property
    def is_flush(self) -> bool:
        return bool(self.flags & FLUSH)

    @property
    def is_fua(self) -> bool:
        return bool(self.flags & FUA)

    @property
    def is_mark(self) -> bool:
        return bool(self.flags & MARK)

    @property
    def is_discard(self) -> bool:
        return bool(self.flags & DISCARD)

    @property
    def is_write(self) -> bool:
        """True if the entry carries data in the log (and writes it on replay)."""
        return self.nr_sectors > 0 and not self.is_discard

    def log_bytes(self, sectorsize: int) -> int:
        """Bytes of data that follow the header block in the log."""
        return self.nr_sectors * sectorsize if self.is_write else 0

    def byte_range(self, sectorsize: int) -> tuple[int, int]:
        """[start, end) on the device, in bytes."""
        return self.sector * sectorsize, (self.sector + self.nr_sectors) * sectorsize

    def next_offset(self, sectorsize: int) -> int:
        """Where the following entry's header starts in the log."""
        return self.data_offset + self.log_bytes(sectorsize)


class Closing:
    """`with obj:` closes obj at the end; subclasses define close()."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class LogReader(Closing):
    """A dm-log-writes log opened read-only; entries are parsed lazily."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = _open_log(path)
        try:
            self.size = os.lseek(self._fd, 0, os.SEEK_END)  # works for block devices too
            self._regular = stat.S_ISREG(os.fstat(self._fd).st_mode)
            self.version, self.nr_entries, self.sectorsize = self._read_super()
        except BaseException:
            os.close(self._fd)
            raise

    def _read_super(self) -> tuple[int, int, int]:
        raw = os.pread(self._fd, SUPER.size, 0)
        if len(raw) < SUPER.size:
            raise UsageError(f"{self.path}: not a dm-log-writes log (only {len(raw)} bytes)")
        magic, version, nr_entries, sectorsize = SUPER.unpack(raw)
        if magic != MAGIC:
            raise UsageError(f"{self.path}: not a dm-log-writes log (magic 0x{magic:x})")
        if version != VERSION:
            raise UsageError(f"{self.path}: unsupported dm-log-writes version {version} (expected {VERSION})")
        if not valid_sectorsize(sectorsize):
            raise UsageError(f"{self.path}: bad sectorsize {sectorsize} in the super block (want a power of two in 512..65536)")
        return version, nr_entries, sectorsize

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __iter__(self) -> Iterator[Entry]:
        return self.entries()

    def entries(self) -> Iterator[Entry]:
        """Yield the nr_entries entries in log order, validating each."""
        offset = self.sectorsize
        for index in range(self.nr_entries):
            entry, offset = self._read_entry(index, offset)
            yield entry

    def _read_entry(self, index: int, offset: int) -> tuple[Entry, int]:
        """The entry whose header is at OFFSET, and the offset of the next one."""
        ss = self.sectorsize
        if offset + ss > self.size:
            raise self._truncated(index, offset)
        # The whole header block in one read: the padding byte replay-log checks and a
        # mark's text are in it (a second read per mark made a scan of a scale-1.0 log,
        # millions of marks, twice as slow).
        raw = os.pread(self._fd, ss, offset)
        sector, nr_sectors, flags, data_len = HEADER.unpack_from(raw)
        if (flags == 0 and nr_sectors == 0) or (flags != MARK and raw[HEADER.size] != 0):
            raise UsageError(f"{self.path}: malformed entry {index} (byte offset {offset})")
        # Inlined Entry.next_offset: this loop is the hot path of a big log.
        next_offset = offset + ss + (0 if flags & DISCARD else nr_sectors * ss)
        if next_offset > self.size:
            raise self._truncated(index, offset)
        mark = self._mark_text(raw, data_len) if flags & MARK else None
        return Entry(index, sector, nr_sectors, flags, data_len, mark, offset, offset + ss), next_offset

    def _mark_text(self, block: bytes, data_len: int) -> str:
        # The text lives inside the header block; a bogus data_len cannot
        # reach past it, and like replay-log's strncmp we stop at a zero byte.
        length = min(data_len, self.sectorsize - HEADER.size)
        text = block[HEADER.size:HEADER.size + length].split(b"\0", 1)[0]
        return text.decode("utf-8", errors="replace")

    def _truncated(self, index: int, offset: int) -> UsageError:
        return UsageError(f"{self.path}: truncated at entry {index} (byte offset {offset})")

    def read_data(self, entry: Entry) -> bytes:
        """The data an entry writes (b"" for flushes, marks and discards)."""
        length = entry.log_bytes(self.sectorsize)
        data = os.pread(self._fd, length, entry.data_offset) if length else b""
        if len(data) != length:  # the log shrank since it was scanned
            raise self._truncated(entry.index, entry.header_offset)
        return data

    def mirror_data(self, entry: Entry, fd: int, offset: int, skip: int = 0, length: int | None = None) -> bool:
        """Put the data ENTRY writes (or its LENGTH bytes from SKIP on) at OFFSET of FD, copied
        in the kernel, the log's holes (zeros: a recorder writes zeros as holes) punched instead
        of read and compared. False (nothing done) where the log is not a regular file."""
        if not self._regular:
            return False
        total = entry.log_bytes(self.sectorsize)
        if entry.data_offset + total > os.fstat(self._fd).st_size:  # the log shrank since it was scanned
            raise self._truncated(entry.index, entry.header_offset)
        length = total - skip if length is None else length
        assert 0 <= skip and skip + length <= total, (skip, length, total)
        start = entry.data_offset + skip
        mirror_range(self._fd, fd, start, start + length, offset)
        return True

    def check_bounds(self, entry: Entry, device_bytes: int) -> None:
        """Raise UsageError if ENTRY touches bytes at or past DEVICE_BYTES."""
        if entry.nr_sectors == 0 or entry.byte_range(self.sectorsize)[1] <= device_bytes:
            return
        verb = "discards" if entry.is_discard else "writes"
        last = entry.sector + entry.nr_sectors - 1
        raise UsageError(
            f"{self.path}: entry {entry.index} {verb} sectors {entry.sector}..{last} "
            f"past the device end ({device_bytes // self.sectorsize} sectors)"
        )

    def device_bytes_needed(self) -> int:
        """Smallest device size that holds every write and discard in the log."""
        return max((e.byte_range(self.sectorsize)[1] for e in self if e.nr_sectors), default=0)


def _open_log(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise UsageError(f"{path}: cannot open log: {e.strerror}") from e
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISBLK(mode)):
        os.close(fd)
        raise UsageError(f"{path}: not a dm-log-writes log (not a regular file or block device)")
    return fd


class LogWriter(Closing):
    """Writes a log the way dm-log-writes does, byte for byte.

    Like the kernel, the super block's nr_entries is rewritten after every FUA
    entry and every mark, and on close(); a writer that dies in between
    leaves a log whose readers see only the entries up to that point.
    """

    def __init__(self, path: str, sectorsize: int = 512) -> None:
        if not valid_sectorsize(sectorsize):
            raise UsageError(f"{path}: bad sectorsize {sectorsize} (want a power of two in 512..65536)")
        self.path = path
        self.sectorsize = sectorsize
        self.nr_entries = 0
        self._fd = create_file(path)
        self._offset = sectorsize
        self._write_super()

    def _write_super(self) -> None:
        block = SUPER.pack(MAGIC, VERSION, self.nr_entries, self.sectorsize)
        os.pwrite(self._fd, block.ljust(self.sectorsize, b"\0"), 0)

    def _append(self, sector: int, nr_sectors: int, flags: int, text: bytes = b"", data: bytes = b"") -> int:
        header = HEADER.pack(sector, nr_sectors, flags, len(text)) + text
        os.pwrite(self._fd, header.ljust(self.sectorsize, b"\0") + data, self._offset)
        self._offset += self.sectorsize + len(data)
        index = self.nr_entries
        self.nr_entries += 1
        if flags & (FUA | MARK):
            self._write_super()
        return index

    def write(self, sector: int, data: bytes, flags: int = 0) -> int:
        """Log a write of DATA (whole sectors) at SECTOR; FLAGS may add FLUSH, FUA, METADATA."""
        if flags & ~(FLUSH | FUA | METADATA):
            raise ValueError(f"write flags {flags_str(flags)}: only FLUSH, FUA and METADATA apply to a write")
        if not data or len(data) % self.sectorsize:
            raise ValueError(f"write of {len(data)} bytes: must be a positive multiple of {self.sectorsize}")
        return self._append(_sector(sector), len(data) // self.sectorsize, flags, data=data)

    def flush(self, flags: int = 0) -> int:
        """Log an empty cache flush (FLAGS may add FUA or METADATA)."""
        return self._append(0, 0, FLUSH | flags)

    def discard(self, sector: int, nr_sectors: int) -> int:
        if nr_sectors <= 0:
            raise ValueError(f"discard of {nr_sectors} sectors: must be positive")
        return self._append(_sector(sector), nr_sectors, DISCARD)

    def mark(self, text: str) -> int:
        raw = text.encode()
        if b"\0" in raw or len(raw) > max_mark_bytes(self.sectorsize):
            # The kernel would silently cut it; a mark that cannot be found
            # again later is worse than an error now.
            raise UsageError(f"mark {text!r}: must be at most {max_mark_bytes(self.sectorsize)} bytes without NUL")
        return self._append(0, 0, MARK, text=raw)

    def close(self, end_mark: bool = True) -> None:
        """Append END_MARK (as removing the kernel target does) and finalize nr_entries."""
        if self._fd < 0:
            return
        try:
            if end_mark:
                self.mark(END_MARK)
            self._write_super()
        finally:
            os.close(self._fd)
            self._fd = -1

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        # A body that failed did not finish its workload: no end mark, the
        # way a recorder torn down by a crash leaves none.
        self.close(end_mark=exc_type is None)


def _sector(sector: int) -> int:
    if sector < 0:
        raise ValueError(f"sector {sector}: must not be negative")
    return sector
