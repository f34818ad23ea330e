"""Options several commands share."""

from __future__ import annotations

import argparse

from checkers.fsrules import DEFAULT_TIER, TIERS


def add_semantics_option(p: argparse.ArgumentParser, default: str | None = DEFAULT_TIER) -> None:
    p.add_argument("--semantics", choices=TIERS, default=default,
                   help="the oracle's rules: posix (man pages) or linux (posix plus what ext4, xfs and btrfs "
                        "developers test after a power cut, docs/semantics.md)"
                        + (f" (default: {default})" if default else " (default: the saved run's)"))
