"""What the guest kernel says about itself on its console: panics, oopses, BUGs, WARNINGs.

The console is ttyS0 (kernel messages up to KERN_WARNING: the guest boots
with loglevel=5, so WARN() lines reach it). A kernel problem during a
workload or a recovery mount is a finding of kind `kernel`; its evidence is
an excerpt of the console around the first such line. Only the kernel's own
bug reports count: a file system that reports corruption (EXT4-fs error ...)
is judged by fsck and the oracle, not here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# (event, pattern): the first line of the kernel's report of a bug.
PATTERNS = [
    ("panic", re.compile(r"Kernel panic - not syncing")),
    ("oops", re.compile(r"\bOops: ")),
    ("bug", re.compile(r"\bBUG: |kernel BUG at ")),
    # "WARNING: CPU: 0 PID: 77 at FILE:LINE func" (6.x) or, since 6.19,
    # "WARNING: FILE:LINE at func, CPU#0: comm/pid" (7.x).
    ("warning", re.compile(r"\bWARNING: (CPU: |at |[\w./-]+:\d+ at )")),
    ("general-protection", re.compile(r"general protection fault")),
    ("hung-task", re.compile(r"INFO: task .* blocked for more than")),
    ("sanitizer", re.compile(r"\b(UBSAN|KASAN|KFENCE|KMSAN): ")),
    ("lockdep", re.compile(r"possible (circular|recursive) locking dependency")),
]
EXCERPT_BEFORE, EXCERPT_AFTER = 5, 40
# What a deliberate sysrq crash (a test fault) prints instead of a bug report.
SYSRQ = re.compile(r"sysrq: Trigger a crash")


@dataclass(frozen=True)
class KernelEvent:
    event: str         # panic, oops, bug, warning, ...
    line: str          # the first line of the report, timestamp stripped
    excerpt: str       # console lines around it

    def rule(self) -> str:
        """The bug's identity for deduplication: the event and where the kernel says it was."""
        # A source FILE:LINE wherever the line has it (before or after "at": the 6.x and 7.x
        # WARNING formats), so one bug keeps its identity across kernels.
        source = re.search(r"\b([\w./-]+\.[ch]:\d+)\b", self.line)
        if source:
            return f"{self.event}:{source.group(1)}"
        where = re.search(r"\b(at|in) ([\w./]+(:\d+)?|\w+\+0x[0-9a-f]+)", self.line)
        return f"{self.event}:{where.group(2)}" if where else self.event


_TIMESTAMP = re.compile(r"^\[\s*\d+\.\d+\]\s*")


def first_event(text: str) -> KernelEvent | None:
    """The first kernel bug report in console TEXT, or None."""
    lines = text.splitlines()
    for i, raw in enumerate(lines):
        line = _TIMESTAMP.sub("", raw.strip())
        for event, pattern in PATTERNS:
            if pattern.search(line):
                excerpt = "\n".join(s.rstrip() for s in lines[max(0, i - EXCERPT_BEFORE):i + EXCERPT_AFTER])
                return KernelEvent(event, line[:300], excerpt)
    return None


def sysrq_event(text: str) -> KernelEvent | None:
    """A deliberate crash (echo c > /proc/sysrq-trigger) reported as such."""
    lines = text.splitlines()
    for i, raw in enumerate(lines):
        if SYSRQ.search(raw):
            return KernelEvent("sysrq-crash", _TIMESTAMP.sub("", raw.strip())[:300],
                               "\n".join(s.rstrip() for s in lines[max(0, i - EXCERPT_BEFORE):i + EXCERPT_AFTER]))
    return None


def died_event(text: str, why: str) -> KernelEvent:
    """The event for a guest that died or hung: its own report if it printed one, else WHY."""
    event = sysrq_event(text) or first_event(text)
    if event is not None:
        return event
    lines = [s.rstrip() for s in text.splitlines() if s.strip()]
    return KernelEvent(why, (lines[-1] if lines else "(no console output)")[:300], "\n".join(lines[-EXCERPT_AFTER:]))
