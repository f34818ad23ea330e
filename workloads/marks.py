"""Marks: the lines pc-exec writes to the recorder's mark file.

Each mark is one write() of one '\\n'-terminated line, logged in order with
the block writes of the recorded device:

    <prefix>start                    before the first op of any thread
    <prefix>op <thread>.<seq>.<iter> after op <seq> (iteration <iter>) of thread
                                     <thread> (its index) returned
    <prefix>end                      after every thread finished

Repeat iterations get no mark of their own; their ops do. The prefix
(at most PREFIX_MAX characters, no newline) tells runs sharing a log apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# Marks the harness itself writes around a workload.
MARK_MKFS = "pc:mkfs-done"      # crash points start after this mark
MARK_MOUNTED = "pc:mounted"
MARK_WORKLOAD_END = "pc:workload-end"

MARK_MAX = 479    # bytes one mark may hold (the recorder's limit)
PREFIX_MAX = 400  # pc-exec's limit, leaving room for the longest op mark
_OP = re.compile(r"op (\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class Mark:
    event: Literal["start", "op", "end"]
    thread: int | None = None
    seq: int | None = None
    iter: int | None = None


def format_mark(mark: Mark, prefix: str = "") -> str:
    """The exact text pc-exec writes for MARK, newline included."""
    if mark.event == "op":
        return f"{prefix}op {mark.thread}.{mark.seq}.{mark.iter}\n"
    return f"{prefix}{mark.event}\n"


def parse_mark(text: str | bytes, prefix: str = "") -> Mark | None:
    """The mark in TEXT, or None if it is no mark of a run with PREFIX."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = text.removesuffix("\n")
    if not text.startswith(prefix):
        return None
    body = text[len(prefix):]
    if body in ("start", "end"):
        return Mark(body)
    m = _OP.fullmatch(body)
    return Mark("op", int(m[1]), int(m[2]), int(m[3])) if m else None
