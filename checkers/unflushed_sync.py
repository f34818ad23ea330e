"""Crash states that lose a write a completed sync(2) had not flushed when it returned.

ext4 without a journal keeps its metadata (directory blocks, inode table,
bitmaps) in the block device's page cache. sync(2) runs ->sync_fs, where
ext4_sync_fs issues the only cache flush, and only then writes and waits on
every block device's cache; syncfs(2) ends the same way (fs/sync.c:
ksys_sync, sync_filesystem; fs/ext4/super.c: ext4_sync_fs; fs/ext4/inode.c:
ext4_write_inode leaves the inode's buffer to that block-device pass). No
flush follows, so those writes may still sit in the disk's volatile cache
when sync returns, which breaks sync(2)'s promise (the guarantees of fsync(2)
on every file, disk cache included). A state that lacks one of them is the
documented bug `ext4-nojournal-sync-unflushed` (docs/bugs/), not new damage:
its findings get TAG in their evidence, and their signatures SUFFIX, which
the documented bug's `crash_state` condition asks for. Damage in a state
that holds every write of the sync stays a plain finding.

Where the log shows the sync's unflushed writes depends on the recorder:
- logged when they complete (the fuse recorder): between the sync's last
  FLUSH and its mark; a reordering at a crash point before any later write
  that drops one loses it;
- logged at the next flush (dm-log-writes keeps a write that is not FUA
  until a flush or its removal, and logs marks at once: the dm and vm
  backends): after the sync's mark. A state from the mark up to the next
  flush that lacks one loses it; later ops' writes logged in that stretch
  cannot be told from the sync's, so they count too.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from checkers.findings import Finding
from foundation.errors import UsageError
from replay.crashstates import CrashPlan, CrashState, split_recovery_id

TAG = "unflushed_sync"          # Finding.evidence: the log entry of the sync's mark
SUFFIX = "@unflushed-sync"      # appended to a tagged finding's signature rule (fuzz/trial.py)


@dataclass(frozen=True)
class SyncTails:
    """The writes each completed sync may have left unflushed, in one log."""

    syncs: list[int]     # marks of completed whole-file-system syncs, ascending
    writes: list[int]    # log entries that write the device, ascending
    flushes: list[int]   # FLUSH entries, ascending
    at_flush: bool       # the recorder logs a write that is not FUA at the next flush

    def tail(self, mark: int) -> list[int]:
        """The writes that may have been unflushed when the sync of MARK returned."""
        k = bisect.bisect_left(self.flushes, mark)
        if self.at_flush:
            stop = bisect.bisect_left(self.writes, self.flushes[k]) if k < len(self.flushes) else len(self.writes)
            return self.writes[bisect.bisect_right(self.writes, mark):stop]
        last = self.flushes[k - 1] if k else -1
        return self.writes[bisect.bisect_right(self.writes, last):bisect.bisect_left(self.writes, mark)]

    def lost(self, state: CrashState) -> int | None:
        """The mark of the completed sync whose unflushed write STATE lacks, or None."""
        k = bisect.bisect_right(self.syncs, state.point)
        if not k:
            return None
        mark = self.syncs[k - 1]
        tail = self.tail(mark)
        missing = {e.index for e in state.epoch} - set(state.persisted)
        if self.at_flush:
            # A crash point past the next flush has the tail durable; before it, the tail's
            # writes not yet logged are missing from the state.
            missing |= {w for w in tail if w > state.point}
        else:
            # Nothing written after the sync yet: a later op's write cannot be what was lost.
            after = bisect.bisect_right(self.writes, mark)
            if after < len(self.writes) and self.writes[after] <= state.point:
                return None
        return mark if missing & set(tail) else None


def tag_losses(findings: Iterable[Finding], plan: CrashPlan, tails: SyncTails) -> None:
    """Put TAG in the evidence of each finding whose crash state lost a sync's unflushed write."""
    if not tails.syncs:
        return
    for f in findings:
        sid = f.state_id or (f"p{f.crash_point}" if f.crash_point is not None else None)
        if sid is None:
            continue
        try:
            state = plan.state(split_recovery_id(sid)[0])
        except UsageError:
            continue  # not a state of this log (a --image recheck names its own)
        mark = tails.lost(state)
        if mark is not None:
            f.evidence[TAG] = mark
