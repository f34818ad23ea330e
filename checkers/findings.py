"""A finding: a real violation of a documented guarantee, with its evidence."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# What each kind means is documented in README.md ("Finding kinds").
KINDS = ("kernel", "mount", "fsck", "durability", "stale-data", "atomicity", "design", "latency", "semantics")


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
