"""Options several commands share, and the one place a run's options are parsed (`run_config`)."""

from __future__ import annotations

import argparse
from typing import Any

from checkers.fsrules import DEFAULT_TIER, TIERS
from foundation.options import Option
from harness.backends import ENGINES, tools
from harness.backends.engine import declared_options, option_keys
from harness.pipeline.config import RunConfig


def add_semantics_option(p: argparse.ArgumentParser, default: str | None = DEFAULT_TIER) -> None:
    p.add_argument("--semantics", choices=TIERS, default=default,
                   help="the oracle's rules: posix (man pages) or linux (posix plus what ext4, xfs and btrfs "
                        "developers test after a power cut, docs/semantics.md)"
                        + (f" (default: {default})" if default else " (default: the saved run's)"))


def add_known_damage_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--known-damage-findings", action="store_true",
                   help="report damage the configuration documents after a crash (ext4 -O ^has_journal: fsck errors "
                        "in crash states no completed sync covers) as findings, instead of counting it in the report "
                        "as expected damage (docs/semantics.md)")


def add_option(p: argparse.ArgumentParser | argparse._ArgumentGroup, o: Option) -> None:
    """One plug-in's option (a backend's, a fuzz engine's) as the argument it declares."""
    p.add_argument(o.flag, **o.argparse_kwargs())


def add_backend_options(p: argparse.ArgumentParser, scopes: tuple[str, ...] = ()) -> None:
    """--backend and the options the engines declare (run, fuzz, minimize, corpus run): those of
    every command, and those of the SCOPES this command takes ("test": --fault; "one-run": one
    run's own devices and device timing)."""
    engines = "; ".join(f"{e.name}: {e.summary}" for e in ENGINES.values())
    p.add_argument("--backend", default="fuse", metavar="|".join(ENGINES), help=engines)
    for o in declared_options():
        if not o.scope or o.scope in scopes:
            add_option(p, o)
    add_option(p, tools.OPTION)


def backend_values(args: argparse.Namespace) -> dict[str, Any]:
    """--backend and the engines' own options this command has (--kernel, --fault, --data-dev, ...)."""
    return {"backend": args.backend, **{k: getattr(args, k) for k in option_keys() if hasattr(args, k)},
            **({"tools": args.tools} if getattr(args, "tools", None) else {})}


def recovery_values(args: argparse.Namespace) -> dict[str, Any]:
    """The recovery options (--recovery unset: the default rw; --recovery-crash*, where the command has them)."""
    values: dict[str, Any] = {"recovery": args.recovery or "rw"}
    if hasattr(args, "recovery_crash"):
        values.update(recovery_crash=args.recovery_crash, recovery_crash_states=args.recovery_crash_states,
                      recovery_crash_rate=args.recovery_crash_rate)
    return values


def run_config(args: argparse.Namespace, **values: Any) -> RunConfig:
    """ARGS' backend and recovery options and the command's VALUES (run config keys), parsed into
    typed values and checked, once (a bad one: one line, exit 2, before anything is made)."""
    return RunConfig.parse({**backend_values(args), **recovery_values(args), **values})
