"""`powercut log dump`, `powercut replay-log` and `powercut crash-image`.

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

import argparse
import functools
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from foundation.errors import EnvError, PowercutError, RefusedError, UsageError
from foundation.ownership import create_file, require_owned
from replay.logformat import DISCARD, FLUSH, FUA, MARK, Entry, LogReader, flags_str
from replay.replayer import ALL_SECTORS, XFSTESTS_ZERO_LIMIT, Replayer, find_mark
from replay.crashstates import RECOVERY_LOG_DIR, recovery_log_name, split_recovery_id
from replay.stateimage import build_crash_image

_CHECK_FLAGS = {"flush": FLUSH, "fua": FUA, "discard": DISCARD}


class NotInLog(PowercutError):
    """What replay-log was asked to find is not in the log: exit 1, as xfstests' replay-log."""

    exit_code = 1
# strtoull(s, &end, 0) with nothing left over: hex, octal or decimal.
_C_UINT = re.compile(r"0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*")


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_log(subparsers)
    _register_replay_log(subparsers)
    _register_crash_image(subparsers)


def _register_log(subparsers: argparse._SubParsersAction) -> None:
    log = subparsers.add_parser("log", help="inspect dm-log-writes logs")
    sub = log.add_subparsers(dest="log_command", metavar="ACTION")
    log.set_defaults(func=lambda _args: _usage(log))
    dump = sub.add_parser("dump", help="print one line per log entry")
    dump.add_argument("log", metavar="LOG", help="dm-log-writes log (file or block device)")
    dump.add_argument("--data", action="store_true", help="add a sha256 prefix of each write's data")
    dump.set_defaults(func=_run_dump)


def _register_replay_log(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay-log", help="replay a dm-log-writes log (xfstests replay-log options)")
    p.add_argument("--log", metavar="LOG", help="dm-log-writes log to read (required)")
    p.add_argument("--replay", metavar="TARGET", help="image file to replay onto; created if missing")
    p.add_argument("--size", metavar="BYTES", help="size of a new TARGET (default: enough for the log's highest sector)")
    p.add_argument("--limit", metavar="N", help="replay at most N entries")
    p.add_argument("--start-entry", metavar="N", help="start at entry N")
    p.add_argument("--start-mark", metavar="MARK", help="start after the mark MARK")
    p.add_argument("--end-mark", metavar="MARK", help="stop after the mark MARK")
    p.add_argument("--next-flush", action="store_true", help="stop after the next flush")
    p.add_argument("--next-fua", action="store_true", help="stop after the next FUA")
    p.add_argument("--find", action="store_true", help="print INDEX@BLOCK of the stopping entry instead of replaying")
    p.add_argument("--num-entries", action="store_true", help="print the number of entries in the log")
    p.add_argument("--no-discard", action="store_true", help="do not replay discards")
    p.add_argument("--start-sector", metavar="S", help="skip writes that end at or before log sector S")
    p.add_argument("--end-sector", metavar="E", help="skip writes that start after log sector E")
    p.add_argument("--check", metavar="N|flush|fua|discard", help="when to run --fsck")
    p.add_argument("--fsck", metavar="CMD", help="shell command run at each --check point; failure exits 1")
    p.add_argument("-v", "--verbose", action="count", default=0, help="print replayed entries (-vv: also skipped ones)")
    p.set_defaults(func=_run_replay_log)


def _register_crash_image(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("crash-image", help="build the crash image of one crash state (an id from a report)",
                              description="Build exactly the image a crash walk checked for state ID "
                                          "(e.g. p57, p57-d33, p57-t33k0-2, p57-r12, p57-e5), unrecovered; or a state "
                                          "inside the recovery of one (p57/r12), given that recovery's log.")
    p.add_argument("--log", metavar="LOG", required=True, help="dm-log-writes log the state comes from")
    p.add_argument("--state", metavar="ID", required=True, help="crash state id")
    p.add_argument("--size", metavar="BYTES", required=True, help="device size (report.json: device_bytes)")
    p.add_argument("--out", metavar="IMG", required=True, help="image file to write (new, or one powercut made)")
    p.add_argument("--recovery-log", metavar="LOG", default=None,
                   help="for ORIGINAL/rN ids: the log of that recovery (default: recovery-logs/ORIGINAL.rw.log, "
                        "else ORIGINAL.ro.log, beside --log)")
    p.set_defaults(func=_run_crash_image)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _os_errors_are_env_errors(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """An I/O failure (EIO, ENOSPC, EACCES) ends the command with one line, not a traceback."""

    @functools.wraps(func)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except OSError as e:
            raise EnvError(f"{e.filename or args.command}: {e.strerror or e}") from e

    return wrapper


@_os_errors_are_env_errors
def _run_dump(args: argparse.Namespace) -> int:
    with LogReader(args.log) as reader:
        ss = reader.sectorsize
        lines = itertools.chain(
            [f"log {args.log}: version={reader.version} sectorsize={ss} nr_entries={reader.nr_entries}"],
            (_dump_line(reader, e, args.data) for e in reader),
        )
        return _print_lines(lines)


def _dump_line(reader: LogReader, entry: Entry, with_data: bool) -> str:
    line = f"{entry.index} sector={entry.sector} nr_sectors={entry.nr_sectors} flags={flags_str(entry.flags)}"
    if entry.mark is not None:
        line += f" mark={json.dumps(entry.mark)}"  # quoted: a mark may hold spaces or newlines
    if with_data and entry.is_write:
        line += f" sha256={hashlib.sha256(reader.read_data(entry)).hexdigest()[:16]}"
    return line


def _print_lines(lines: Iterator[str]) -> int:
    try:
        for line in lines:
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:
        # `powercut log dump LOG | head` is normal use; keep Python's exit
        # flush from raising again on the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


@dataclass(frozen=True)
class _Options:
    """replay-log's options, parsed and checked before the log is opened."""

    limit: int
    start_entry: int
    stop_flags: int
    check_every: int
    check_flags: int
    size: int | None
    sectors: tuple[int, int]

    @classmethod
    def parse(cls, args: argparse.Namespace) -> _Options:
        if not args.log:
            raise UsageError("replay-log: --log LOG is required")
        if bool(args.fsck) != bool(args.check):
            raise UsageError("replay-log: --fsck and --check go together")
        check_every, check_flags = _parse_check(args.check)
        stop_flags = (FLUSH if args.next_flush else 0) | (FUA if args.next_fua else 0)
        return cls(
            limit=_optional_uint(args.limit, "--limit") or 0,
            start_entry=_optional_uint(args.start_entry, "--start-entry") or 0,
            stop_flags=stop_flags | (MARK if args.end_mark is not None else 0),
            check_every=check_every,
            check_flags=check_flags,
            size=_optional_uint(args.size, "--size"),
            sectors=(_optional_uint(args.start_sector, "--start-sector") or ALL_SECTORS[0],
                     ALL_SECTORS[1] if args.end_sector is None else _c_uint(args.end_sector, "--end-sector")),
        )


def _c_uint(text: str, option: str) -> int:
    if not _C_UINT.fullmatch(text):
        raise UsageError(f"{option} {text!r} is not a number")
    return int(text, 16 if text[:2] in ("0x", "0X") else 8 if text[:1] == "0" else 10)


def _optional_uint(text: str | None, option: str) -> int | None:
    return None if text is None else _c_uint(text, option)


def _parse_check(check: str | None) -> tuple[int, int]:
    """(every N entries, flag mask) for --check."""
    if check is None:
        return 0, 0
    if check in _CHECK_FLAGS:
        return 0, _CHECK_FLAGS[check]
    every = _c_uint(check, "--check")
    if every == 0:
        raise UsageError("replay-log: --check takes a number >= 1, flush, fua or discard")
    return every, 0


def _stops(entry: Entry, stop_flags: int, end_mark: str | None) -> bool:
    """replay-log's should_stop: once MARK is a stop flag, only that mark stops."""
    if not entry.flags & stop_flags:
        return False
    if not stop_flags & MARK:
        return True
    return entry.is_mark and entry.mark == end_mark


@_os_errors_are_env_errors
def _run_replay_log(args: argparse.Namespace) -> int:
    opts = _Options.parse(args)
    with LogReader(args.log) as reader:
        start = _start_index(reader, args, opts)
        if args.find:
            return _find(reader, start, args, opts)
        if args.num_entries:
            print(reader.nr_entries)
            return 0
        if args.replay is None:
            print(f"Log version={reader.version}, sectorsize={reader.sectorsize}, entries={reader.nr_entries}")
            return 0
        _prepare_target(args.replay, reader, opts.size)
        with Replayer(reader, args.replay, discard=not args.no_discard, sectors=opts.sectors,
                      zero_limit=XFSTESTS_ZERO_LIMIT, on_zero_skipped=_zero_skipped(args.verbose)) as replayer:
            replayer.skip_to(start)
            return _replay(replayer, args, opts)


def _start_index(reader: LogReader, args: argparse.Namespace, opts: _Options) -> int:
    if args.start_mark is not None:
        try:
            start = find_mark(reader, args.start_mark) + 1
        except UsageError as e:
            raise NotInLog(str(e)) from None
        seek_line = _seek_line
    else:
        start = opts.start_entry
        if start and start >= reader.nr_entries:
            raise NotInLog(f"{reader.path}: --start-entry {start}: the log has {reader.nr_entries} entries")
        seek_line = _seek_entry_line
    if args.verbose > 1:
        for entry in itertools.islice(reader, start):
            print(seek_line(reader, entry))
    return start


@_os_errors_are_env_errors
def _run_crash_image(args: argparse.Namespace) -> int:
    size = _c_uint(args.size, "--size")
    with LogReader(args.log) as reader:
        if size < reader.device_bytes_needed():
            raise UsageError(f"--size {size}: the log writes up to byte {reader.device_bytes_needed()}")
        state = build_crash_image(reader, args.state, size, args.out, _recovery_log(args))
    print(f"{args.out}: crash state {args.state} ({state.mode}): entries 0..{state.epoch_start - 1} "
          f"and {len(state.persisted)} of the {len(state.epoch)} writes after the last flush")
    return 0


def _recovery_log(args: argparse.Namespace) -> str | None:
    """The recovery log a state inside a recovery needs: --recovery-log, or the one a run kept."""
    original, inner = split_recovery_id(args.state)
    if inner is None or args.recovery_log:
        return args.recovery_log
    for mode in ("rw", "ro"):  # the names checkers/crashwalk/recovery_crash.py gives them
        path = os.path.join(os.path.dirname(args.log), RECOVERY_LOG_DIR, recovery_log_name(original, mode))
        if os.path.exists(path):
            return path
    raise UsageError(f"state {args.state!r}: no recovery log for {original} beside {args.log}; give --recovery-log")


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


def _zero_skipped(verbose: int) -> Callable[[int], None]:
    def note(length: int) -> None:
        if verbose:
            print(f"discard len {length} larger than max {XFSTESTS_ZERO_LIMIT}")
    return note


def _find(reader: LogReader, start: int, args: argparse.Namespace, opts: _Options) -> int:
    for count, entry in enumerate(itertools.islice(reader, start, None), start=1):
        if args.verbose > 1:
            print(_seek_line(reader, entry))
        if count == opts.limit or _stops(entry, opts.stop_flags, args.end_mark):
            print(f"{entry.index}@{entry.next_offset(reader.sectorsize) // reader.sectorsize}")
            return 0
    raise NotInLog(f"{reader.path}: --find: no entry from {start} on meets the stop condition")


def _prepare_target(path: str, reader: LogReader, size: int | None) -> None:
    """Create TARGET, or accept an existing one only if it is a regular file powercut made."""
    if not os.path.lexists(path):
        os.close(create_file(path, reader.device_bytes_needed() if size is None else size))
        return
    if os.path.islink(path) or not os.path.isfile(path):
        raise RefusedError(f"refusing to replay onto {path}: not a regular file")
    if os.path.samefile(path, reader.path):
        raise RefusedError(f"refusing to replay onto {path}: it is the log")
    require_owned(path, "replay onto")


def _replay(replayer: Replayer, args: argparse.Namespace, opts: _Options) -> int:
    reader = replayer.reader
    discarded = False
    for count in itertools.count(1):
        entry = replayer.read_next()
        if entry is None:
            break
        skipped = replayer.skips(entry)
        if args.verbose > 1 or (args.verbose and not skipped):
            print(_replay_line(reader, entry, skipped))
        if args.verbose and entry.is_discard and entry.nr_sectors and replayer.discard and not discarded:
            print("replay device doesn't support discard, switching to writing zeros")
            discarded = True
        replayer.apply(entry)
        if _check_due(entry, count, opts) and not _fsck_passes(replayer, args.fsck, entry):
            return 1
        if count == opts.limit or _stops(entry, opts.stop_flags, args.end_mark):
            break
    replayer.fsync()
    return 0


def _check_due(entry: Entry, count: int, opts: _Options) -> bool:
    if opts.check_every:
        return count % opts.check_every == 0
    return bool(entry.flags & opts.check_flags)


def _fsck_passes(replayer: Replayer, command: str, entry: Entry) -> bool:
    replayer.fsync()
    sys.stdout.flush()  # keep our -v lines ahead of the command's output
    status = subprocess.run(command, shell=True, check=False).returncode
    if status == 0:
        return True
    how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
    print(f"powercut: fsck failed after entry {entry.index} ({how})", file=sys.stderr)
    return False
