"""The `powercut` command: one subcommand per job, each module registers its own."""

from __future__ import annotations

import argparse
import importlib
import sys

from foundation import internal_error
from foundation.errors import PowercutError

# Modules that expose register(subparsers): each adds its subcommands and sets
# `func` (args -> exit code) on them.
COMMAND_MODULES = [
    "cli.replay_log",
    "cli.run",
    "cli.scenario",
    "cli.cleanup",
    "cli.bench",
    "cli.corpus",
    "cli.fuzz",
    "cli.campaign",
    "cli.export",
    "cli.bisect",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="powercut", description="File-system crash consistency and per-op latency.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # not written yet
                continue
            raise
        mod.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    internal_error.forget_output_dir()
    try:
        return int(args.func(args))
    except PowercutError as e:
        print(f"powercut: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("powercut: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0
    except Exception as e:  # a bug: exit 3, never 1 (findings); teardown already ran on the way up
        print(internal_error.one_line(e, internal_error.save_traceback(e)), file=sys.stderr)
        return internal_error.EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
