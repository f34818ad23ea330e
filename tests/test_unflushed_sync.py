"""Crash states that lost a write a completed sync left unflushed (checkers/unflushed_sync.py) are
the documented bug ext4-nojournal-sync-unflushed; damage in a state that holds every write of the
sync is not, on either kind of log (writes logged when they complete, or at the next flush)."""

from __future__ import annotations

import json

from checkers import documented_bugs as db
from checkers.findings import Finding
from checkers.unflushed_sync import TAG, SyncTails, tag_losses
from conftest import WORKLOADS
from replay.crashstates import CrashPlan, ReorderSpec
from replay.logformat import FLUSH, MARK, Entry


def plan(flags: str) -> tuple[CrashPlan, SyncTails, SyncTails]:
    """A log from FLAGS, one letter an entry: w write, f flush, m the sync's mark."""
    kinds = {"w": 0, "f": FLUSH, "m": MARK}
    entries = [Entry(i, 8 * i if c == "w" else 0, 8 if c == "w" else 0, kinds[c], 0, "op 0.1.0" if c == "m" else None, 0, 0)
               for i, c in enumerate(flags)]
    writes = [e.index for e in entries if e.is_write]
    flushes = [e.index for e in entries if e.is_flush]
    syncs = [e.index for e in entries if e.is_mark]
    p = CrashPlan(entries, 512, [], ReorderSpec.parse("drop-one"))
    return p, SyncTails(syncs, writes, flushes, at_flush=False), SyncTails(syncs, writes, flushes, at_flush=True)


def test_logged_at_completion_a_reordering_after_the_sync_lost_its_tail() -> None:
    """w0 f1 w2 w3 m4 w5 f6: the sync's writes 2 and 3 follow its last flush."""
    p, done, _ = plan("wfwwmwf")
    assert done.tail(4) == [2, 3]
    assert done.lost(p.state("p4-d2")) == 4 and done.lost(p.state("p4-d3")) == 4
    assert done.lost(p.state("p4")) is None            # the prefix has every write of the sync
    assert done.lost(p.state("p3-d2")) is None          # before the sync returned: no promise yet
    assert done.lost(p.state("p5-d2")) is None          # a later op wrote: its loss may be the cause


def test_a_flushed_sync_has_no_tail() -> None:
    p, done, at_flush = plan("wwfmwf")
    assert done.tail(3) == [] and done.lost(p.state("p3")) is None
    assert at_flush.tail(3) == [4]  # logged at the next flush: what follows the mark may be the sync's


def test_logged_at_the_next_flush_the_state_at_the_mark_lacks_the_tail() -> None:
    """dm-log-writes: w0 f1 m2 w3 w4 f5: the sync's writes are logged after its mark."""
    p, _, at_flush = plan("wfmwwf")
    assert at_flush.tail(2) == [3, 4]
    assert at_flush.lost(p.state("p2")) == 2           # the writes not logged yet
    assert at_flush.lost(p.state("p4")) is None         # all of them, in order
    assert at_flush.lost(p.state("p4-d3")) == 2
    assert at_flush.lost(p.state("p5")) is None         # the flush that made them durable


def test_tagged_findings_are_the_documented_bug_and_others_are_not() -> None:
    p, done, _ = plan("wfwwmwf")
    found = [Finding("fsck", "bitmap differences", crash_point=4, state_id=s) for s in ("p4-d2", "p4")]
    tag_losses(found, p, done)
    assert [f.evidence.get(TAG) for f in found] == [4, None]
    doc = json.loads((WORKLOADS / "ext4_nojournal_sync_unflushed.json").read_text())

    def verdict(sig: str, mkfs: str = "-O ^has_journal") -> str:
        return db.triage(fs="ext4", mkfs_opts=mkfs, signature=sig, doc=doc, kernel="7.2.13+deb14-amd64").bug or "new"
    assert verdict("durability|sync|sync-all@unflushed-sync") == "ext4-nojournal-sync-unflushed"
    assert verdict("fsck|-|bitmap-differences@unflushed-sync") == "ext4-nojournal-sync-unflushed"
    assert verdict("durability|sync|sync-all") == "new"                       # a state with the sync's writes
    assert verdict("fsck|-|bitmap-differences@unflushed-sync", mkfs="") == "new"  # a journal orders them
    no_sync = {**doc, "threads": [{**doc["threads"][0], "ops": doc["threads"][0]["ops"][:-1]}]}
    assert db.triage(fs="ext4", mkfs_opts="-O ^has_journal", signature="fsck|-|x@unflushed-sync",
                     doc=no_sync).verdict == "new"
