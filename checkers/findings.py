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


# What a file system returns for later calls once it has stopped itself after an internal
# error: btrfs aborts the transaction and forces itself read-only (EROFS once in the error
# state, the abort's own error, often EIO, from the handle that saw it: btrfs commits
# acce952b0263 "forced readonly mounts on errors" and 59131393434b, which documents EROFS for
# this); ext4 with its default errors=remount-ro remounts read-only (EROFS,
# Documentation/admin-guide/ext4.rst); xfs shuts down and fails further I/O with EIO.
ERROR_STATE_ERRNOS = ("EIO", "EROFS")


def fold_error_state(findings: list[Finding]) -> list[Finding]:
    """FINDINGS with the consequences of a kernel finding folded into it: when the workload
    already raised one (a WARNING, BUG or error of the file system under test), the calls the
    model expected to succeed or fail otherwise that returned EIO or EROFS report the state the
    file system put itself in, not bugs of their own; each was a separate `semantics` finding,
    so one corruption made several findings, each shrunk and saved on its own. They are listed
    in the kernel finding's evidence (`calls_failed_after`). Other semantics findings stay."""
    kernel = next((f for f in findings if f.kind == "kernel" and f.evidence.get("phase") == "workload"), None)
    if kernel is None:
        return findings
    folded = [f for f in findings if f.kind == "semantics" and f.evidence.get("errno") in ERROR_STATE_ERRNOS]
    if not folded:
        return findings
    kernel.evidence["calls_failed_after"] = [f.detail for f in folded]
    kernel.detail += f"; {len(folded)} later call(s) failed with {'/'.join(sorted({f.evidence['errno'] for f in folded}))}"
    return [f for f in findings if not any(f is g for g in folded)]


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
