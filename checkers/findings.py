"""A finding: a real violation of a documented guarantee, with its evidence."""

from __future__ import annotations

import errno
import os
from dataclasses import asdict, dataclass, field
from typing import Any

# What each kind means is documented in docs/running.md ("Finding kinds"; the short table is in README.md).
KINDS = ("kernel", "mount", "fsck", "corruption", "durability", "stale-data", "atomicity", "design", "latency",
         "semantics")

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
    recovery: str | None = None       # how it was recovered, when not the default rw mount: "ro"

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, {})}


def kernel_finding(event: dict[str, Any], **where: Any) -> Finding:
    """A `kernel` finding: the kernel under test reported a bug of its own (or died, or hung)
    during PHASE (the workload, or the recovery mount of a crash image). EVENT holds
    event, line, console (excerpt), phase, rule; see harness/backends/vm/console.py."""
    detail = f"guest kernel {event['event']} during the {event['phase']}: {event['line']}"
    return Finding("kernel", detail, **where,
                   evidence={"event": event["event"], "phase": event["phase"], "rule": event.get("rule", event["event"]),
                             "console": event.get("console", "")})


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
