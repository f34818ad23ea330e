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

Counted only where no other commit can land in the fsync's window: one
thread (no other op's sync or fsync runs meanwhile), and the fsync returned
within HALF the commit interval of the workload's first op (the transaction
kthread commits only a transaction older than the interval, default 30 s;
the half leaves room for the mount before the first op).

The same boundaries serve `btrfs-log-dirs` (note_transactions: which ops
share the transaction an fsync logged in) and `btrfs-relog` (a file logged
by one fsync, linked or renamed, and the log synced again by a later one).
"""

from __future__ import annotations

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


def _quiet(h: History, mount_opts: str) -> int | None:
    """Where no commit can hide from the log: one thread and a short run (the module's doc).
    Returns the end of that span (ns), None when there is none."""
    if len(h.threads) != 1 or not h.execs:
        return None
    return h.execs[0].rec.start_ns + commit_interval(mount_opts) * 1_000_000_000 // 2


def note_transactions(h: History, found: list[Super], mount_opts: str = "") -> None:
    """h.btrfs_since: for each fsync, the first position after the last commit written before
    the op that preceded it: the ops of the transaction its log tree carries (`btrfs-log-dirs`)."""
    end = _quiet(h, mount_opts)
    if end is None:
        return
    commits = [s.index for s in found if s.commit]
    marks = [ex.mark for ex in h.execs]
    for p in h.persists:
        ex = p.ex
        if p.ino is None or ex.pos == 0 or ex.rec.end_ns >= end:
            continue
        before = marks[ex.pos - 1]
        if before is None or any(m is None for m in marks[:ex.pos]):
            continue
        last = max((c for c in commits if c < before), default=-1)
        h.btrfs_since[ex.pos] = sum(1 for m in marks[:ex.pos] if m < last)  # type: ignore[operator]


def add_commit_persists(h: History, found: list[Super], mount_opts: str = "") -> int:
    """For each fsync (fdatasync, O_SYNC write, msync) whose call ends with a transaction
    commit (the last super block written between the previous op's mark and its own is a
    commit's), a whole-file-system persist at the fsync: what a sync there would make
    durable. Returns how many were added."""
    end = _quiet(h, mount_opts)
    if end is None or not found:
        return 0
    added: list[Persist] = []
    for p in h.persists:
        ex = p.ex
        if p.ino is None or ex.mark is None or ex.pos == 0 or ex.rec.end_ns >= end:
            continue
        before = h.execs[ex.pos - 1].mark
        if before is None:
            continue
        window = [s for s in found if before < s.index < ex.mark]
        if window and window[-1].commit:
            added.append(Persist(ex, RULE, None, min(p.prefix, ex.pos), names_only=True))
    if added:
        # Completion order: each right after the fsync's own persist.
        by_ex = {id(p.ex): p for p in added}
        merged: list[Persist] = []
        for p in h.persists:
            merged.append(p)
            q = by_ex.pop(id(p.ex), None) if p.ino is not None else None
            if q is not None:
                merged.append(q)
        h.persists[:] = merged
    return len(added)


RELOG = "btrfs-relog"


def _last_super(found: list[Super], lo: int, hi: int) -> Super | None:
    """The last super block written strictly between log entries LO and HI."""
    got = None
    for s in found:
        if lo < s.index < hi:
            got = s
    return got


def add_relog_persists(h: History, found: list[Super], mount_opts: str = "") -> int:
    """`btrfs-relog`: a file fsynced by a log sync, then linked or renamed with no data change
    in between (only xattr changes), in the same transaction: the link or rename relogs it
    (tree-log.c, btrfs_log_new_name), and a later fsync that syncs the log persists that copy:
    its xattrs as of the link or rename. Added as persists of the file at the later fsync."""
    end = _quiet(h, mount_opts)
    if end is None or not found:
        return 0
    marks = [ex.mark for ex in h.execs]
    if any(m is None for m in marks):
        return 0
    commits = [s.index for s in found if s.commit]

    def log_synced(pos: int) -> bool:
        s = _last_super(found, marks[pos - 1], marks[pos])  # type: ignore[arg-type]
        return pos > 0 and s is not None and not s.commit

    fsyncs = [p for p in h.persists if p.ino is not None and p.rule == "fsync-data" and p.ex.pos > 0
              and p.ex.rec.end_ns < end and log_synced(p.ex.pos)]
    added: list[Persist] = []
    for y in fsyncs:
        before = marks[y.ex.pos - 1]
        for x in fsyncs:
            if x.ex.pos >= y.ex.pos or x.ino == y.ino:
                continue
            if any(marks[x.ex.pos] < c < before for c in commits):  # type: ignore[operator]
                continue  # another transaction: x's logged copy was committed and dropped
            ino = h.inodes[x.ino]  # type: ignore[index]
            data = [e.pos for e in ino.events if x.ex.pos < e.pos < y.ex.pos]
            renamed = [pos for pos, paths, inos in h.name_changes
                       if x.ex.pos < pos < y.ex.pos and ino.ino in inos and h.execs[pos].kind in ("link", "rename")
                       and any(h.ns[pos + 1].get(q) == ino.ino for q in paths)
                       and not any(d <= pos for d in data)]
            if renamed:
                added.append(Persist(y.ex, RELOG, ino.ino, renamed[-1] + 1))
    if added:
        k = {id(p.ex) for p in added}
        merged: list[Persist] = []
        for p in h.persists:
            merged.append(p)
            if id(p.ex) in k and p.ino is not None and p.rule == "fsync-data":
                merged += [q for q in added if q.ex is p.ex]
        h.persists[:] = merged
    return len(added)
