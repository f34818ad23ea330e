"""Options several commands share."""

from __future__ import annotations

import argparse

from checkers.fsrules import DEFAULT_TIER, TIERS
from harness.backends import BACKENDS, check_kernel_args
from foundation.errors import UsageError


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


def add_backend_options(p: argparse.ArgumentParser) -> None:
    """--backend, --kernel and --kernel-modules: who records and recovers (run, fuzz, corpus run)."""
    p.add_argument("--backend", default="fuse", metavar="|".join(BACKENDS),
                   help="fuse: the host kernel through the userspace recorder (default); dm: the host kernel's "
                        "own dm-log-writes on loop devices; vm: the kernel under test (--kernel) in a QEMU guest "
                        "with its own dm-log-writes; auto: dm where the host has it, else fuse")
    p.add_argument("--kernel", default=None, metavar="debian:PACKAGE|PATH",
                   help="--backend vm: the kernel under test, a Debian kernel package "
                        "(e.g. debian:linux-image-6.12-amd64) or a vmlinux/bzImage file")
    p.add_argument("--kernel-modules", default=None, metavar="DIR",
                   help="--backend vm with --kernel PATH: its lib/modules/VERSION directory (with modules.dep)")


def check_backend_options(args: argparse.Namespace) -> None:
    """One line, exit 2, for a bad combination (argparse's choices would print the whole usage)."""
    if args.backend not in BACKENDS:
        raise UsageError(f"unknown --backend {args.backend!r}: available: {', '.join(BACKENDS)}")
    check_kernel_args(args.backend, args.kernel, args.kernel_modules)
