"""btrfs transaction commits, as the log shows them, and what a commit inside
an fsync makes durable (the `btrfs-commit` rule, checkers/fsrules.py).

btrfs writes its super block (64 KiB into the device) at the end of every
transaction commit and of every log-tree sync. A commit drops the log tree:
its super block has a log root of 0 and the new generation. A log sync
keeps the generation and names the log tree's root. So the log tells, for
each fsync, whether btrfs synced its log tree or fell back to a full
transaction commit (tree-log.c: BTRFS_LOG_FORCE_COMMIT, btrfs_set_log_full_commit),
and a commit carries every metadata change of the running transaction: the
names every op that had returned before the fsync was called left (not the
data of other files: a commit writes no dirty pages, so no sizes either).

btrfs also commits on its own (seen on 6.18 right after a sync: a commit
landing inside a later fsync, which then synced its log). Such a commit is
told from the fsync's own only where the log shows it elsewhere: inside an
op that syncs nothing, or followed by a log sync in the same call; a run
with one gets no `btrfs-commit` persists at all. Counted only in one
thread's runs (no other op's sync or fsync meanwhile) whose fsync returned
within half the commit interval of the first op (the transaction kthread
commits a transaction older than the interval, default 30 s, on its own).

The same boundaries serve `btrfs-log-dirs` (note_transactions: which ops
share the transaction an fsync logged in) and `btrfs-relog` (a file logged
by one fsync, linked or renamed, and the log synced again by a later one).
Both need an fsync that synced the log with no commit during the call, and
no commit between the op that made btrfs log more and that fsync: a commit
still running when the fsync starts cannot hide after it, since a log sync
waits for the running commit's super block (transaction.c holds
tree_log_mutex until write_all_supers is done).
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

from checkers.history import History, Persist
from replay.logformat import LogReader

SUPER_OFFSET = 64 * 1024
_FIELDS = struct.Struct("<QQQQ")   # generation, root, chunk_root, log_root
_FIELDS_AT = 0x48                  # after csum (32), fsid (16), bytenr, flags, magic
_MAGIC = b"_BHRfS_M"
_MAGIC_AT = 0x40
COMMIT_INTERVAL_S = 30             # btrfs(5): commit=<seconds>, default 30
RULE = "btrfs-commit"


@dataclass(frozen=True)
class Super:
    index: int       # log entry
    generation: int
    log_root: int    # 0: written by a transaction commit

    @property
    def commit(self) -> bool:
        return self.log_root == 0


def supers(reader: LogReader) -> list[Super]:
    """Every write of the primary super block, in log order."""
    out = []
    for e in reader.entries():
        if not e.is_write:
            continue
        start, end = e.byte_range(reader.sectorsize)
        if not start <= SUPER_OFFSET < end:
            continue
        block = reader.read_data(e)[SUPER_OFFSET - start:]
        if block[_MAGIC_AT:_MAGIC_AT + 8] != _MAGIC:
            continue  # mkfs zeroing the area, or not btrfs
        gen, _, _, log_root = _FIELDS.unpack_from(block, _FIELDS_AT)
        out.append(Super(e.index, gen, log_root))
    return out


def commit_interval(mount_opts: str) -> int:
    for tok in mount_opts.replace(",", " ").split():
        if tok.startswith("commit="):
            try:
                return int(tok.split("=", 1)[1]) or COMMIT_INTERVAL_S
            except ValueError:
                pass
    return COMMIT_INTERVAL_S


class Transactions:
    """The log's commits placed among the ops (single-threaded runs, by completion marks); made
    once per run and shared by the three rules (the persists they add are at fsyncs that
    already have one, so what it reads of h.persists does not change)."""

    def __init__(self, h: History, found: list[Super], mount_opts: str) -> None:
        self.h = h
        self.found = found
        self.at = [s.index for s in found]
        self.commits = [s.index for s in found if s.commit]
        marks = [ex.mark for ex in h.execs]
        n = next((k for k, m in enumerate(marks) if m is None), len(marks))  # unmarked ops go last
        self.marks: list[int] = marks[:n]  # type: ignore[assignment]
        # Where no commit can hide from the log (the module's doc): one thread, a short run.
        quiet = len(h.threads) == 1 and bool(h.execs)
        self.end = h.execs[0].rec.start_ns + commit_interval(mount_opts) * 1_000_000_000 // 2 if quiet else -1
        # A commit btrfs ran on its own (not the op's): inside an op that syncs nothing, or
        # followed by a log sync inside the same fsync (seen on 6.18, generic/343's shape).
        syncing = {p.ex.pos for p in h.persists}
        self.unprompted = False
        for k, s in enumerate(found):
            pos = bisect.bisect_left(self.marks, s.index)
            if s.commit and 0 < pos < len(self.marks):
                later = found[k + 1:bisect.bisect_left(self.at, self.marks[pos])]
                if pos not in syncing or any(not x.commit for x in later):
                    self.unprompted = True

    def counted(self, pos: int) -> bool:
        """The op at POS (and the one before it) returned in the quiet span."""
        return 0 < pos < len(self.marks) and self.h.execs[pos].rec.end_ns < self.end

    def last_super(self, pos: int) -> Super | None:
        """The last super block written during the op at POS (after the previous op's mark)."""
        k = bisect.bisect_left(self.at, self.marks[pos]) - 1
        return self.found[k] if k >= 0 and self.at[k] > self.marks[pos - 1] else None

    def since(self, pos: int) -> int:
        """The first position after the last commit written before the op at POS was called."""
        k = bisect.bisect_left(self.commits, self.marks[pos - 1])
        return bisect.bisect_left(self.marks, self.commits[k - 1]) if k else 0

    def log_synced(self, pos: int) -> bool:
        """The op at POS synced the log tree and no commit landed during it."""
        s = self.last_super(pos)
        return s is not None and not s.commit and not self.committed_between(pos - 1, pos)

    def committed_between(self, a: int, b: int) -> bool:
        """A commit written after the op at A returned and before the op at B returned."""
        k = bisect.bisect_right(self.commits, self.marks[a])
        return k < len(self.commits) and self.commits[k] < self.marks[b]


def note_transactions(t: Transactions) -> None:
    """h.btrfs_since: for each fsync, the first position after the last commit written before
    the op that preceded it: the ops of the transaction its log tree carries (`btrfs-log-dirs`)."""
    h = t.h
    for p in h.persists:
        if p.ino is not None and t.counted(p.ex.pos) and t.log_synced(p.ex.pos):
            h.btrfs_since[p.ex.pos] = t.since(p.ex.pos)


def add_commit_persists(t: Transactions) -> int:
    """For each fsync (fdatasync, O_SYNC write, msync) whose call ends with a transaction
    commit (the last super block written between the previous op's mark and its own is a
    commit's), a whole-file-system persist of names at the fsync: what a sync there would
    make durable of the namespace. Returns how many were added."""
    h = t.h
    if t.unprompted:
        return 0  # one could land inside an fsync that logged nothing: not the fsync's commit
    added = []
    for p in h.persists:
        if p.ino is not None and t.counted(p.ex.pos):
            s = t.last_super(p.ex.pos)
            if s is not None and s.commit:
                added.append(Persist(p.ex, RULE, None, min(p.prefix, p.ex.pos), names_only=True))
    _insert_after_own(h, added)
    return len(added)


RELOG = "btrfs-relog"


def add_relog_persists(t: Transactions) -> int:
    """`btrfs-relog`: a file older than the transaction, fsynced by a log sync, then linked or
    renamed with no data change in between (xattr changes only), in the same transaction: the
    link or rename logs it again (tree-log.c, btrfs_log_new_name), and the next fsync that syncs
    the log persists that copy: its xattrs as of the link or rename. Added as a persist of the
    file at that fsync."""
    h = t.h
    synced = [p for p in h.persists if p.ino is not None and p.rule == "fsync-data" and t.counted(p.ex.pos)
              and t.log_synced(p.ex.pos)]
    if not synced:
        return 0
    at = [p.ex.pos for p in synced]
    own: dict[int, list[int]] = {}
    for p in synced:
        own.setdefault(p.ino, []).append(p.ex.pos)  # type: ignore[arg-type]
    added = []
    for pos, paths, inos in h.name_changes:
        if h.execs[pos].kind not in ("link", "rename") or pos >= len(t.marks):
            continue
        for x in inos:
            mine = own.get(x, [])
            k = bisect.bisect_left(mine, pos)
            if not k or not any(h.ns[pos + 1].get(q) == x for q in paths):
                continue
            fx = mine[k - 1]  # the file's last log-synced fsync before the link or rename
            ino = h.inodes[x]
            if ino.created >= t.since(fx) or any(fx < e.pos <= pos for e in ino.events):
                continue
            j = bisect.bisect_right(at, pos)
            while j < len(synced) and synced[j].ino == x:
                j += 1  # its own fsync: fsync-data covers it
            if j == len(synced) or t.committed_between(fx, synced[j].ex.pos):
                continue  # no later log sync in the same transaction
            added.append(Persist(synced[j].ex, RELOG, x, pos + 1))
    _insert_after_own(h, added)
    return len(added)


def _insert_after_own(h: History, added: list[Persist]) -> None:
    """Completion order: each added persist right after its op's own (fsync) persist."""
    if not added:
        return
    by_ex: dict[int, list[Persist]] = {}
    for q in added:
        by_ex.setdefault(id(q.ex), []).append(q)
    merged: list[Persist] = []
    for p in h.persists:
        merged.append(p)
        if p.ino is not None and p.rule in ("fsync-data", "fdatasync-data"):
            merged += by_ex.pop(id(p.ex), [])
    merged += [q for qs in by_ex.values() for q in qs]  # an O_SYNC write's or msync's: at the end
    h.persists[:] = sorted(merged, key=lambda p: p.ex.pos) if by_ex else merged
