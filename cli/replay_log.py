"""`powercut log dump`, `powercut replay-log` and `powercut crash-image`: options in,
lines out. What replay-log does with its options (xfstests' replay-log
semantics) is replay/replaylog.py; crash images are built by replay/stateimage.py.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from collections.abc import Callable, Iterator

from foundation.errors import EnvError, UsageError
from replay.crashstates import kept_recovery_log
from replay.logformat import DISCARD, FLUSH, FUA, MARK, LogReader
from replay.replayer import ALL_SECTORS
from replay.replaylog import ReplayLogSpec, dump_lines, find, prepare_target, replay, start_index
from replay.stateimage import build_crash_image

_CHECK_FLAGS = {"flush": FLUSH, "fua": FUA, "discard": DISCARD}
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
        return _print_lines(dump_lines(reader, args.data))


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


def _spec(args: argparse.Namespace) -> ReplayLogSpec:
    """replay-log's options, parsed and checked before the log is opened."""
    if not args.log:
        raise UsageError("replay-log: --log LOG is required")
    if bool(args.fsck) != bool(args.check):
        raise UsageError("replay-log: --fsck and --check go together")
    check_every, check_flags = _parse_check(args.check)
    stop_flags = (FLUSH if args.next_flush else 0) | (FUA if args.next_fua else 0)
    return ReplayLogSpec(
        limit=_optional_uint(args.limit, "--limit") or 0,
        start_entry=_optional_uint(args.start_entry, "--start-entry") or 0,
        start_mark=args.start_mark,
        end_mark=args.end_mark,
        stop_flags=stop_flags | (MARK if args.end_mark is not None else 0),
        check_every=check_every,
        check_flags=check_flags,
        fsck=args.fsck,
        discard=not args.no_discard,
        size=_optional_uint(args.size, "--size"),
        sectors=(_optional_uint(args.start_sector, "--start-sector") or ALL_SECTORS[0],
                 ALL_SECTORS[1] if args.end_sector is None else _c_uint(args.end_sector, "--end-sector")),
        verbose=args.verbose,
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


@_os_errors_are_env_errors
def _run_replay_log(args: argparse.Namespace) -> int:
    spec = _spec(args)
    with LogReader(args.log) as reader:
        start = start_index(reader, spec, print)
        if args.find:
            find(reader, start, spec, print)
            return 0
        if args.num_entries:
            print(reader.nr_entries)
            return 0
        if args.replay is None:
            print(f"Log version={reader.version}, sectorsize={reader.sectorsize}, entries={reader.nr_entries}")
            return 0
        prepare_target(args.replay, reader, spec.size)
        return replay(reader, args.replay, start, spec, print)


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
    return args.recovery_log or kept_recovery_log(args.log, args.state)
