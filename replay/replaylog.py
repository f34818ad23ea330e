"""xfstests' replay-log on a dm-log-writes log: where to start, when to stop, when to
run fsck, and the lines -v prints. The command (cli/replay_log.py) parses the
options into a ReplayLogSpec and prints what this module says.

replay-log takes xfstests' replay-log options with the same meaning, checked
against xfstests src/log-writes/replay-log.c (main, should_stop, run_fsck,
seek_to_mark) and src/log-writes/log-writes.c (log_seek_entry,
log_seek_next_entry, log_replay_next_entry):

- Only the first nr_entries entries (super block count) exist.
- Start: --start-mark M looks for a MARK whose text is exactly M from entry 0
  and starts at the entry after it (the mark itself is consumed); it overrides
  --start-entry. --start-entry N starts at entry N, which must exist. Entries
  before the start are not applied: the target keeps what it holds.
- Stops are tested after an entry is replayed (or visited, with --find), so
  the stopping entry is included: --limit N (0 = none) after N entries
  counted from the start; --end-mark M at a MARK with text M; --next-flush /
  --next-fua at an entry carrying FLUSH / FUA. replay-log's quirk is kept:
  once --end-mark is given, a flag stop only fires on that mark.
- A stop that never comes is not an error: the whole log is replayed.
- --find writes nothing and prints "INDEX@BLOCK" for the stopping entry,
  BLOCK being the log offset just past that entry (header + data; a discard
  has no data) in sectorsize units. --find wins over --num-entries, which
  prints the super block's nr_entries; with neither and no --replay, the
  line "Log version=1, sectorsize=S, entries=N" is printed.
- --check N runs --fsck after every Nth replayed entry (N >= 1, counted from
  the start); --check flush|fua|discard after each entry with that flag. One
  needs the other. The target is fsync'ed first; the check runs before the
  stop test; a failing fsck ends the replay.
- --no-discard skips discard entries. A discard is zeroed the way replay-log
  zeroes on a target that cannot discard (a regular file): in chunks of at
  most 1 GiB, each chunk larger than 128 MiB left as it is (-v says so:
  "discard len L larger than max 134217728"; the first discard prints
  "replay device doesn't support discard, switching to writing zeros").
- --start-sector S / --end-sector E (log sectors): a write that ends at or
  before S or starts after E is skipped (not written, still counted for
  --limit and --check); entries without sectors and discards never are.
- Numbers are read like strtoull(s, 0): decimal, 0x hex, leading-0 octal.
- -v prints "replaying I@B: sector S, size BYTES, flags 0xF(NAMES)" for each
  replayed entry (B = log block just past its header); -vv adds the same
  line as "skipping ..." for entries outside the sector range, and
  "seek entry I@B: S, size NR_SECTORS, flags 0xF(NAMES)" for entries passed
  over while looking for --start-mark or finding (--start-entry's seek prints
  "seek entry I@B: S, size NR_SECTORS, flags 0xF", B its header's block).
- Exit status 1, as replay-log's, when what was asked for is not in the log:
  no --start-mark mark, no entry --start-entry, no entry meeting --find's
  condition; and when an --fsck check fails. One line on stderr says which.

Deliberate differences: other errors (bad options, a malformed log, an I/O
error) are one line and exit 2 (replay-log: exit 1); an empty log is
accepted with start entry 0 (replay-log rejects every start entry on it); an
fsck killed by a signal fails (replay-log's WEXITSTATUS reads 0); the target
is a regular file powercut created, never a device, and existing content is
kept (so consecutive --start-entry runs continue one replay); --check also
takes `discard`. Not implemented: --discard-zeroes-data (not in replay-log
any more).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from foundation.errors import PowercutError, RefusedError, UsageError
from foundation.ownership import create_file, require_owned
from replay.logformat import MARK, Entry, LogReader, flags_str
from replay.replayer import ALL_SECTORS, XFSTESTS_ZERO_LIMIT, Replayer, find_mark

Say = Callable[[str], None]  # prints one line of the command's output


class NotInLog(PowercutError):
    """What replay-log was asked to find is not in the log: exit 1, as xfstests' replay-log."""

    exit_code = 1


@dataclass(frozen=True)
class ReplayLogSpec:
    """replay-log's options as typed values, checked before the log is opened."""

    limit: int = 0                 # stop after this many entries (0: no limit)
    start_entry: int = 0
    start_mark: str | None = None  # start after this mark (wins over start_entry)
    end_mark: str | None = None
    stop_flags: int = 0            # FLUSH / FUA / MARK: stop after an entry carrying one
    check_every: int = 0           # run fsck after every Nth replayed entry
    check_flags: int = 0           # ... or after each entry with one of these flags
    fsck: str | None = None        # shell command; a failure ends the replay (exit 1)
    discard: bool = True
    size: int | None = None        # of a new target (None: enough for the log)
    sectors: tuple[int, int] = ALL_SECTORS
    verbose: int = 0


def dump_lines(reader: LogReader, with_data: bool) -> Iterator[str]:
    """`powercut log dump`: the super block, then one line per entry."""
    yield f"log {reader.path}: version={reader.version} sectorsize={reader.sectorsize} nr_entries={reader.nr_entries}"
    for entry in reader:
        line = f"{entry.index} sector={entry.sector} nr_sectors={entry.nr_sectors} flags={flags_str(entry.flags)}"
        if entry.mark is not None:
            line += f" mark={json.dumps(entry.mark)}"  # quoted: a mark may hold spaces or newlines
        if with_data and entry.is_write:
            line += f" sha256={hashlib.sha256(reader.read_data(entry)).hexdigest()[:16]}"
        yield line


def stops(entry: Entry, spec: ReplayLogSpec) -> bool:
    """replay-log's should_stop: once MARK is a stop flag, only that mark stops."""
    if not entry.flags & spec.stop_flags:
        return False
    if not spec.stop_flags & MARK:
        return True
    return entry.is_mark and entry.mark == spec.end_mark


def start_index(reader: LogReader, spec: ReplayLogSpec, say: Say) -> int:
    if spec.start_mark is not None:
        try:
            start = find_mark(reader, spec.start_mark) + 1
        except UsageError as e:
            raise NotInLog(str(e)) from None
        seek_line = _seek_line
    else:
        start = spec.start_entry
        if start and start >= reader.nr_entries:
            raise NotInLog(f"{reader.path}: --start-entry {start}: the log has {reader.nr_entries} entries")
        seek_line = _seek_entry_line
    if spec.verbose > 1:
        for entry in itertools.islice(reader, start):
            say(seek_line(reader, entry))
    return start


def find(reader: LogReader, start: int, spec: ReplayLogSpec, say: Say) -> None:
    """--find: say INDEX@BLOCK of the stopping entry."""
    for count, entry in enumerate(itertools.islice(reader, start, None), start=1):
        if spec.verbose > 1:
            say(_seek_line(reader, entry))
        if count == spec.limit or stops(entry, spec):
            say(f"{entry.index}@{entry.next_offset(reader.sectorsize) // reader.sectorsize}")
            return
    raise NotInLog(f"{reader.path}: --find: no entry from {start} on meets the stop condition")


def prepare_target(path: str, reader: LogReader, size: int | None) -> None:
    """Create TARGET, or accept an existing one only if it is a regular file powercut made."""
    if not os.path.lexists(path):
        os.close(create_file(path, reader.device_bytes_needed() if size is None else size))
        return
    if os.path.islink(path) or not os.path.isfile(path):
        raise RefusedError(f"refusing to replay onto {path}: not a regular file")
    if os.path.samefile(path, reader.path):
        raise RefusedError(f"refusing to replay onto {path}: it is the log")
    require_owned(path, "replay onto")


def replay(reader: LogReader, target: str, start: int, spec: ReplayLogSpec, say: Say) -> int:
    """Replay from entry START onto TARGET until a stop; 1 if an fsck check failed, else 0."""
    def zero_skipped(length: int) -> None:
        if spec.verbose:
            say(f"discard len {length} larger than max {XFSTESTS_ZERO_LIMIT}")

    with Replayer(reader, target, discard=spec.discard, sectors=spec.sectors,
                  zero_limit=XFSTESTS_ZERO_LIMIT, on_zero_skipped=zero_skipped) as replayer:
        replayer.skip_to(start)
        return _replay(replayer, spec, say)


def _replay(replayer: Replayer, spec: ReplayLogSpec, say: Say) -> int:
    reader = replayer.reader
    discarded = False
    for count in itertools.count(1):
        entry = replayer.read_next()
        if entry is None:
            break
        skipped = replayer.skips(entry)
        if spec.verbose > 1 or (spec.verbose and not skipped):
            say(_replay_line(reader, entry, skipped))
        if spec.verbose and entry.is_discard and entry.nr_sectors and replayer.discard and not discarded:
            say("replay device doesn't support discard, switching to writing zeros")
            discarded = True
        replayer.apply(entry)
        if _check_due(entry, count, spec) and not _fsck_passes(replayer, spec.fsck or "", entry):
            return 1
        if count == spec.limit or stops(entry, spec):
            break
    replayer.fsync()
    return 0


def _check_due(entry: Entry, count: int, spec: ReplayLogSpec) -> bool:
    if spec.check_every:
        return count % spec.check_every == 0
    return bool(entry.flags & spec.check_flags)


def _fsck_passes(replayer: Replayer, command: str, entry: Entry) -> bool:
    replayer.fsync()
    sys.stdout.flush()  # keep our -v lines ahead of the command's output
    status = subprocess.run(command, shell=True, check=False).returncode
    if status == 0:
        return True
    how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
    print(f"powercut: fsck failed after entry {entry.index} ({how})", file=sys.stderr)
    return False


def _seek_line(reader: LogReader, entry: Entry) -> str:
    block = entry.data_offset // reader.sectorsize
    return f"seek entry {entry.index}@{block}: {entry.sector}, size {entry.nr_sectors}, flags 0x{entry.flags:x}({flags_str(entry.flags)})"


def _seek_entry_line(reader: LogReader, entry: Entry) -> str:
    """log_seek_entry's -vv line (--start-entry): the header's block, no flag names."""
    block = entry.header_offset // reader.sectorsize
    return f"seek entry {entry.index}@{block}: {entry.sector}, size {entry.nr_sectors}, flags 0x{entry.flags:x}"


def _replay_line(reader: LogReader, entry: Entry, skipped: bool = False) -> str:
    block = entry.data_offset // reader.sectorsize
    size = entry.nr_sectors * reader.sectorsize
    return (f"{'skipping' if skipped else 'replaying'} {entry.index}@{block}: sector {entry.sector}, size {size}, "
            f"flags 0x{entry.flags:x}({flags_str(entry.flags)})")
