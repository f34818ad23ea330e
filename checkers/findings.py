"""A finding: a real violation of a documented guarantee, with its evidence."""

from __future__ import annotations

import errno
import os
from dataclasses import asdict, dataclass, field
from typing import Any

# What each kind means is documented in README.md ("Finding kinds").
KINDS = ("mount", "fsck", "corruption", "durability", "stale-data", "atomicity", "design", "latency", "semantics")

# The host ran out of something while reading an image: its own problem, not the image's.
HOST_ERRNOS = frozenset({errno.ENOMEM, errno.EMFILE, errno.ENFILE})


@dataclass
class Finding:
    kind: str
    detail: str
    crash_point: int | None = None    # log entry index the crash image ends at
    crash_mark: str | None = None     # the last mark at or before the crash point
    evidence: dict[str, Any] = field(default_factory=dict)
    state_id: str | None = None       # the crash state (replay/crashstates.py), e.g. "p57-d33"

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, {})}


def read_error(e: OSError, mnt: str, path: str | None = None) -> Finding:
    """A `corruption` finding: reading the recovered image mounted at MNT failed
    (EIO, EUCLEAN, EBADMSG, an ENOENT or ELOOP where a name was just seen, ...).
    PATH is what was being checked when E.filename does not say."""
    where = os.path.relpath(str(e.filename), mnt) if e.filename else (path or "?")
    code = errno.errorcode.get(e.errno or 0, str(e.errno))
    return Finding("corruption", f"after recovery, reading {where} fails: {code} ({e.strerror or e})",
                   evidence={"path": where, "errno": code, "strerror": e.strerror or str(e),
                             "expected": f"{where} reads back", "found": f"{code} ({e.strerror or e})"})


def is_host_error(e: OSError) -> bool:
    return e.errno in HOST_ERRNOS
