"""Damage a configuration documents after a crash: counted as its known behaviour, not a finding.

ext4 without a journal (`mkfs -O ^has_journal`) promises no metadata
consistency after a crash:
- ext4(5), `has_journal`: the journal is what ensures "file system
  consistency even across unclean shutdowns";
- the kernel's Documentation/filesystems/ext4/journal.rst: ext4 uses the
  journal "to protect the filesystem against metadata inconsistencies in the
  case of a system crash";
- e2fsck(8): only a file system with a journal is marked clean after the
  journal is replayed; without one, the metadata are checked (and repaired)
  by e2fsck after an unclean shutdown.
So fsck errors, a failed recovery mount and reads of the image that fail
(`fsck`, `mount`, `corruption`) in a crash state are that configuration's
documented behaviour, except where a completed call promised more:
- sync(2)/syncfs(2) write all pending metadata and data of the file system
  before they return, with the guarantees of fsync(2) on every file, which
  include the disk cache (sync(2), fsync(2)): a crash state holding nothing
  written after a completed sync (a single-threaded workload's; with two
  threads another op may be half-written when the sync returns) must be
  consistent, and damage there stays a finding. That holds for reorderings
  too: without a journal the kernel writes the block device's buffers
  (directory blocks, inode table, bitmaps) after ext4_sync_fs's cache flush
  (fs/sync.c), so a sync can return with writes unflushed, and a state that
  loses them lost what a completed sync promised. Such damage is a finding
  (checkers/unflushed_sync.py names it the documented bug
  `ext4-nojournal-sync-unflushed`, docs/bugs/);
- fsync(2)/fdatasync(2)/O_SYNC promise a file's data (and size): the content
  oracle checks those whatever the configuration (`durability` findings are
  never counted here).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from checkers.findings import Finding
from checkers.fsrules import NO_JOURNAL
from checkers.history import History
from replay.crashpoints import mkfs_done
from replay.logformat import LogReader

DAMAGE_KINDS = frozenset({"fsck", "mount", "corruption"})
ROWS_MAX = 50   # expected-damage rows kept in report.json (all are counted)

WHY = ("ext4 without a journal keeps no metadata consistent across a crash (ext4(5) has_journal; "
       "Documentation/filesystems/ext4/journal.rst; e2fsck(8)): damage in a crash state not covered "
       "by a completed sync(2)/syncfs(2) is its documented behaviour")


def configuration_without_metadata_journal(fs: str, mkfs_opts: str) -> str | None:
    """A name for FS with MKFS_OPTS if it promises no metadata consistency after a crash, else None."""
    tokens = set(mkfs_opts.replace(",", " ").split())
    if fs == "ext4" and tokens & set(NO_JOURNAL):
        return "ext4 -O ^has_journal"
    return None


def sync_marks(history: History | None) -> list[int]:
    """Log entries of the marks of completed whole-file-system syncs (single-threaded workloads only)."""
    if history is None or len(history.threads) != 1:
        return []
    return sorted(p.ex.mark for p in history.persists if p.ino is None and p.ex.mark is not None)


@dataclass
class KnownDamage:
    """Which findings a configuration without metadata consistency explains."""

    configuration: str
    syncs: list[int]     # log entries after which the image was consistent (mkfs done, completed syncs)
    writes: list[int]    # log entries that write the device, ascending
    flushes: list[int] = field(default_factory=list)  # FLUSH entries, ascending (unflushed_sync.py reads them)

    def covered_by_sync(self, point: int) -> bool:
        """Whether the image at crash point POINT (the entries up to POINT, itself included)
        holds nothing written after a completed sync: every state there, reordered or not."""
        k = bisect.bisect_right(self.syncs, point)
        if not k:
            return False
        after = bisect.bisect_right(self.writes, self.syncs[k - 1])
        return after == len(self.writes) or self.writes[after] > point

    def explains(self, f: Finding) -> bool:
        if f.kind not in DAMAGE_KINDS or f.crash_point is None:
            return False
        return not self.covered_by_sync(f.crash_point)

    def split(self, findings: Iterable[Finding]) -> tuple[list[Finding], list[Finding]]:
        """(findings, the configuration's known damage)."""
        kept: list[Finding] = []
        known: list[Finding] = []
        for f in findings:
            (known if self.explains(f) else kept).append(f)
        return kept, known

    def report(self, known: list[Finding]) -> dict[str, Any]:
        """report.json `expected_damage`: counted by kind and crash state, the first rows kept."""
        return {"configuration": self.configuration, "why": WHY, "count": len(known),
                "by_kind": dict(sorted(Counter(f.kind for f in known).items())),
                "crash_states": len({f.state_id or f"p{f.crash_point}" for f in known}),
                "rows": [{"kind": f.kind, "state_id": f.state_id, "crash_point": f.crash_point,
                          "detail": f.detail} for f in known[:ROWS_MAX]]}


def known_damage(fs: str, mkfs_opts: str, reader: LogReader, history: History | None) -> KnownDamage | None:
    """What a configuration without metadata consistency explains in the log READER reads; None for the others."""
    configuration = configuration_without_metadata_journal(fs, mkfs_opts)
    if configuration is None:
        return None
    start = mkfs_done(reader)
    entries = list(reader.entries())
    writes = [e.index for e in entries if e.is_write]
    flushes = [e.index for e in entries if e.is_flush]
    syncs = sorted(([start] if start is not None else []) + sync_marks(history))
    return KnownDamage(configuration, syncs, writes, flushes)
