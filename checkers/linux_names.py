"""The linux tier's name rules (checkers/fsrules.py): which names an fsync made
durable beyond POSIX, and whether the recovered names are a prefix of the
completed namespace ops (strictly ordered metadata, ext4 and xfs).

Only an op's *own* name changes count for an inode: the paths the op named
(create, link, unlink, rename from/to), not the children a directory rename
moves along (renaming a parent does not touch the child inode on ext4, so an
fsync of the child does not carry it). An inode is involved in a change at
a path when it gained that name, or lost it and the path became empty; the
victim of a rename-over is left out (no test asserts it; skipping it can
only hide findings, never invent one).
"""

from __future__ import annotations

import bisect
import os
import stat
from dataclasses import dataclass

from checkers.history import ROOT, History, Persist


@dataclass(frozen=True)
class Change:
    pos: int
    path: str
    before: int | None
    after: int | None

    def involves(self, ino: int) -> bool:
        return self.after == ino or (self.before == ino and self.after is None)


def _parent(path: str) -> str:
    return os.path.dirname(path) or ROOT


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:k]) for k in range(1, len(parts))]


class NameIndex:
    """The history's direct name changes, by path, by inode and by parent directory."""

    def __init__(self, h: History) -> None:
        self.h = h
        self.by_path: dict[str, list[Change]] = {}
        self.by_ino: dict[int, list[Change]] = {}
        self.in_dir: dict[int, list[Change]] = {}
        # The syncs, in order: where each ran, and the highest prefix one up to it made durable.
        self._sync_pos: list[int] = []
        self._sync_floor: list[int] = []
        for p in h.persists:  # in completion order
            if p.ino is None:
                self._sync_pos.append(p.ex.pos)
                self._sync_floor.append(max([p.prefix, *self._sync_floor[-1:]]))
        self._displaced: dict[tuple[int, int], set[int]] = {}
        for pos, paths, _ in h.name_changes:
            for path in paths:
                if any(a in paths for a in _ancestors(path)):
                    continue  # moved along with a renamed directory: not the op's own name
                c = Change(pos, path, h.ns[pos].get(path), h.ns[pos + 1].get(path))
                self.by_path.setdefault(path, []).append(c)
                for ino in {c.before, c.after} - {None}:
                    if c.involves(ino):  # type: ignore[arg-type]
                        self.by_ino.setdefault(ino, []).append(c)  # type: ignore[arg-type]
                for ns in (h.ns[pos], h.ns[pos + 1]):
                    d = ns.get(_parent(path))
                    if d is not None and c not in self.in_dir.get(d, []):
                        self.in_dir.setdefault(d, []).append(c)

    def last_change(self, path: str, before: int) -> Change | None:
        got = None
        for c in self.by_path.get(path, ()):
            if c.pos < before:
                got = c
        return got

    def new_dir(self, path: str, at: int) -> bool:
        """PATH names, at version AT, a directory made in this run whose only own
        name change is its creation (btrfs logs such new ancestors on fsync)."""
        ino = self.h.ns[at].get(path)
        if ino is None or self.h.inodes[ino].kind != "dir" or self.h.inodes[ino].created < 0:
            return False
        return [c.path for c in self.by_ino.get(ino, ()) if c.pos < at] == [path]

    def fsync_rule(self, p: Persist, path: str) -> str | None:
        """The linux rule by which fsync P makes PATH's state at P.prefix durable, if any."""
        ino, q = p.ino, p.prefix
        assert ino is not None
        last = self.last_change(path, q)
        if last is not None and last.involves(ino) and self.h.ns[q].get(path) != last.after:
            return None  # moved since by an ancestor's rename: no change of its own to carry
        if last is not None and last.involves(ino):
            unlinked = self.h.inodes[ino].kind == "file" and ino not in self.h.ns[q].values()
            return "fsync-unlinked" if unlinked else "fsync-names"
        if last is not None and self.h.ns[q].get(path) == last.after and \
                any(last.involves(y) for y in self.displaced(ino, q)):
            return "fsync-names"
        for name in (n for n, i in self.h.ns[q].items() if i == ino):
            if path in _ancestors(name) and self.new_dir(path, q):
                return "fsync-names"
        return None

    def btrfs_logged(self, p: Persist, path: str) -> bool:
        """btrfs-log-dirs: whether fsync P's log tree carried PATH's parent directory in full
        (PATH's state at P.prefix is then durable). Only ops of the transaction P logged in
        (h.btrfs_since) count, and only for an inode older than that transaction (a new one's
        fsync leaves its parent's other new entries out, seen on 6.18); none when the log does
        not tell it."""
        since = self.h.btrfs_since.get(p.ex.pos)
        ino, q = p.ino, p.prefix
        if since is None or ino is None:
            return False
        ns = self.h.ns[q]
        d = ns.get(_parent(path))
        if d is None or path == ROOT or self.h.inodes[ino].created >= since:
            return False  # an inode new in the transaction: btrfs logs no parent in full for it
        mine = [c for c in self.by_path.get(path, ()) if since <= c.pos < q]
        if any(self.h.execs[c.pos].kind == "rename" and self.h.execs[c.pos].f("flags") for c in mine):
            return False  # RENAME_EXCHANGE/WHITEOUT: no test asserts them (a healthy campaign saw one lost)
        names = [n for n, i in ns.items() if i == ino]
        if self.h.inodes[ino].kind == "dir":
            return any(self._new_subtree(x, _parent(path), q, since) for x in names)
        created = self.h.inodes[ino].created
        own = [c for c in self.by_ino.get(ino, ()) if since <= c.pos < q and c.pos != created]
        if not own or d not in {ns.get(_parent(n)) for n in names}:
            return False
        # Entries of files and symlinks only (generic/104, 376): a directory moved in or out
        # of the logged parent is not asserted this way (343 and 510 keep theirs by a commit).
        held = {ns.get(path)} | {c.before for c in mine} | {c.after for c in mine}
        return not any(i is not None and self.h.inodes[i].kind == "dir" for i in held)

    def _new_subtree(self, top: str, parent: str, q: int, since: int) -> bool:
        """PARENT lies below TOP through directories made since SINCE, never renamed."""
        if parent == top or not (top == ROOT or parent.startswith(top + "/")):
            return False
        rel = parent if top == ROOT else parent[len(top) + 1:]
        parts = rel.split("/")
        base = "" if top == ROOT else top + "/"
        chain = [base + "/".join(parts[:k]) for k in range(1, len(parts) + 1)]
        for c in chain:
            i = self.h.ns[q].get(c)
            if i is None or self.h.inodes[i].created < since or not self.new_dir(c, q):
                return False
        return True

    def displaced(self, ino: int, q: int) -> set[int]:
        """Inodes whose committed name INO took before version Q, and theirs in turn: btrfs logs
        such a conflicting inode with the name's new owner (generic/341, 342, 502, 526, 527), so
        their own name changes are carried by the fsync too (ext4 and xfs: by ordering anyway).
        Committed: the name held at the last sync before the op took it; a name given and
        taken within one transaction is no conflict (nothing of it on disk to replay over)."""
        got = self._displaced.get((ino, q))
        if got is not None:
            return got
        out: set[int] = set()
        todo = [ino]
        while todo:
            x = todo.pop()
            for c in self.by_ino.get(x, ()):
                if c.after != x or c.pos >= q:
                    continue
                n = bisect.bisect_left(self._sync_pos, c.pos)  # the syncs before the op
                held = self.h.ns[self._sync_floor[n - 1]].get(c.path) if n else None
                if held is not None and held not in (x, ino) and held not in out and c.before != held:
                    out.add(held)  # taken from HELD, which had moved away (not a rename-over victim)
                    todo.append(held)
        self._displaced[(ino, q)] = out
        return out

    def ordered_floor(self, p: Persist) -> int:
        """Strictly ordered metadata: fsync P made its inode's last own name change
        (for a directory: the last change of its entries) durable, so every
        version up to and including that change is durable."""
        assert p.ino is not None
        changes = self.by_ino.get(p.ino, []) + self.in_dir.get(p.ino, [])
        return max((c.pos + 1 for c in changes if c.pos < p.prefix), default=0)


def observed_kind(mnt: str, path: str) -> str | None:
    try:
        st = os.lstat(os.path.join(mnt, path))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return "dir" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else "file"


@dataclass
class OrderGap:
    """Two paths no single prefix of the namespace ops explains."""

    late_path: str        # shows the result of LATE_POS
    late_pos: int
    early_path: str       # but lacks the result of EARLY_POS (earlier or the same op)
    early_pos: int


def order_gap(h: History, observed: dict[str, str | None], versions: list[int]) -> OrderGap | None:
    """None if one namespace version among VERSIONS matches every observed path
    by kind; else the pair of paths that shows why not."""
    def kind(k: int, path: str) -> str | None:
        i = h.ns[k].get(path)
        return None if i is None else h.inodes[i].kind

    fits = {path: [k for k in versions if kind(k, path) == seen] for path, seen in observed.items()}
    if any(all(k in ks for ks in fits.values()) for k in versions):
        return None
    if any(not ks for ks in fits.values()):
        return None  # a path no version explains: the per-path checks report it
    late = max(fits, key=lambda p: min(fits[p]))
    early = min(fits, key=lambda p: max(fits[p]))
    lo, hi = min(fits[late]), max(fits[early])
    if hi >= lo:
        return OrderGap(late, lo - 1, early, lo - 1)  # no clean pair: name the op the late path needs
    return OrderGap(late, lo - 1, early, hi)
