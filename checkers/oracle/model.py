"""The model's questions at a crash point: what is allowed here (no I/O).

From the history (checkers/history.py) and the rules (checkers/fsrules.py):
which ops had returned (checkers/oracle/view.py), what completed persists
guarantee of an inode's data and metadata, from which namespace version a
name is durable and by which rule, and which inodes a path may name. The
history's lookups are memoised in checkers/oracle/index.py; the crash image
is read by checkers/oracle/image.py, which asks these questions.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import Any

from checkers.eventindex import last_allowed
from checkers.fsrules import Semantics
from checkers.history import ROOT, History, Persist
from checkers.linux_names import NameIndex
from checkers.oracle.index import HistoryIndex
from checkers.oracle.view import CrashPoints, PointView
from checkers.timeline import Exec, Inode
from foundation.intervals import IntervalMap


@dataclass
class Guarantee:
    """What completed ops made durable of an inode's data at a crash point."""

    persist: Persist                 # the newest op giving a guarantee (for messages)
    floor: int                       # whole-file guarantee prefix (-1: only ranges)
    content: IntervalMap             # guaranteed content inside `ranges`
    ranges: list[tuple[int, int]]    # where `content` is guaranteed
    size: int                        # the size is at least this
    metadata: Persist | None         # fsync/sync: size, xattrs and link count too


@dataclass
class Cover:
    """Why a name is durable from some version on: the persisting op and the rule."""

    p: Persist
    rule: str

    @property
    def ex(self) -> Exec:
        return self.p.ex


class Model:
    """What the guarantees allow at a crash point, for one workload's history."""

    def __init__(self, history: History, wid: int, semantics: Semantics) -> None:
        self.h = history
        self.wid = wid
        self.semantics = semantics
        self.names = NameIndex(history)
        self.index = HistoryIndex(history)
        self.points = CrashPoints(history)
        self._ordered: dict[int, tuple[int, Persist | None]] = {}
        self._name_floors: dict[str, tuple[list[int], list[tuple[int, Cover | None]]]] = {}
        self.all_paths = sorted({p for ns in history.ns for p in ns})

    def view(self, crash_point: int) -> PointView:
        return self.points.view(crash_point)

    def guarantee(self, ino: Inode, v: PointView) -> Guarantee | None:
        positions, mine = self.index.persists_of(ino)
        done = mine[:bisect.bisect_left(positions, v.n_done)]
        if not done:
            return None
        whole = max((p for p in done if p.range is None), key=lambda p: p.prefix, default=None)
        floor = whole.prefix if whole else -1
        base, size = self.index.content_at(ino, floor) if whole else (IntervalMap(), 0)
        content = base.copy()
        ranges = [(0, size)] if whole else []
        newest = whole
        for p in sorted((p for p in done if p.range and p.prefix > floor), key=lambda p: p.prefix):
            s, t = p.range  # type: ignore[misc]
            m, _ = ino.content_at(p.prefix)
            content.set(s, t, None)
            for a, b, src in m.get(s, t):
                content.set(a, b, src)
            ranges.append((s, t))
            size = max(size, t)
            newest = p
        metadata = whole if whole and whole.rule in ("fsync-data", "sync-all", "btrfs-relog") else None
        return Guarantee(newest or done[-1], floor, content, ranges, size, metadata)

    def name_floor(self, path: str, v: PointView) -> tuple[int, Cover | None]:
        """Version from which PATH's name is durable, and the op and rule that made it so."""
        positions, best = self._name_index(path)
        k = bisect.bisect_left(positions, v.n_done)
        floor, why = best[k - 1] if k else (0, None)
        ordered, p = self.ordered_floor(v)
        if p is not None and ordered > floor:
            floor, why = ordered, Cover(p, "ordered-metadata")
        return floor, why

    def _name_index(self, path: str) -> tuple[list[int], list[tuple[int, Cover | None]]]:
        """For PATH, per persist in completion order: its position, and the highest
        name floor the persists up to it give (the first persist reaching it)."""
        got = self._name_floors.get(path)
        if got is None:
            positions, best = [], []
            floor, why = 0, None
            for p in self.h.persists:  # in completion order
                if p.prefix > floor:
                    r = p.rule if p.ino is None else self.fsync_rule(p, path)
                    if r is not None:
                        floor, why = p.prefix, Cover(p, r)
                positions.append(p.ex.pos)
                best.append((floor, why))
            got = self._name_floors[path] = (positions, best)
        return got

    def fsync_rule(self, p: Persist, path: str) -> str | None:
        """The rule by which persist P (not a sync) makes PATH's name durable, if any."""
        if p.rule != "fsync-data" or p.ino is None:
            return None
        linux = self.semantics.tier == "linux"
        if self.fsync_covers_name(p, path):
            if linux and self.h.inodes[p.ino].kind == "dir" and self.semantics.holds("fsync-dir-entries"):
                return "fsync-dir-entries"
            return "fsync-new-name"
        r = self.names.fsync_rule(p, path) if linux else None
        if r is None and self.semantics.holds("btrfs-log-dirs") and self.names.btrfs_logged(p, path):
            r = "btrfs-log-dirs"
        return r if r is not None and self.semantics.holds(r) else None

    def ordered_floor(self, v: PointView) -> tuple[int, Persist | None]:
        """ordered-metadata: the version every completed fsync's inode's last name
        change lifts the whole namespace to."""
        if not self.semantics.holds("ordered-metadata"):
            return 0, None
        if v.n_done not in self._ordered:
            best: tuple[int, Persist | None] = (0, None)
            for p in self.h.persists:
                if p.ex.pos < v.n_done and p.rule == "fsync-data" and p.ino is not None:
                    f = self.names.ordered_floor(p)
                    if f > best[0]:
                        best = (f, p)
            self._ordered[v.n_done] = best
        return self._ordered[v.n_done]

    def fsync_covers_name(self, p: Persist, path: str) -> bool:
        """fsync-new-name: fsync of a file created in this run, untouched by
        renames/links/unlinks since, makes its path (and new parents) durable.
        fsync of a directory makes its entries durable."""
        if p.rule != "fsync-data" or p.ino is None:
            return False
        ino = self.h.inodes[p.ino]
        ns = self.h.ns[p.prefix]
        if ino.kind == "dir":
            dpaths = [q for q, i in ns.items() if i == ino.ino]
            return any((os.path.dirname(path) or ROOT) == d for d in dpaths)
        names = [q for q, i in ns.items() if i == ino.ino]
        if len(names) != 1 or ino.created < 0:
            return False
        name = names[0]
        if not (path == name or name.startswith(path + "/")):
            return False
        created_at = [q for q, i in self.h.ns[ino.created + 1].items() if i == ino.ino]
        if created_at != [name]:
            return False
        ancestors = {name} | {name[:k] for k in range(len(name)) if name[k] == "/"}
        for pos, paths, inodes in self.h.name_changes:
            if ino.created < pos < p.prefix and (ino.ino in inodes or paths & ancestors):
                return False
        return True

    def candidates(self, path: str, v: PointView) -> tuple[set[int | None], int, Cover | None]:
        """What PATH may name: its inode (or None) in every namespace version from its
        durable floor to n_done, and in those in-flight ops reach."""
        floor, why = self.name_floor(path, v)
        ks, vals = self.index.name_changes_of(path)
        lo, hi = bisect.bisect_right(ks, floor), bisect.bisect_right(ks, v.n_done)
        got = {vals[lo - 1], *vals[lo:hi]} if floor <= v.n_done else set()  # versions in between change nothing
        got |= {self.h.ns[k].get(path) for k in v.versions_after}
        return got | self.moved_dir_entries(path, floor, v), floor, why

    def moved_dir_entries(self, path: str, floor: int, v: PointView) -> set[int | None]:
        """Without ordered metadata (btrfs), a directory's name and its entries become durable
        apart: an fsync logs a directory whose committed name its file took (or swapped) only as
        existing (tree-log.c, log_conflicting_inodes: LOG_INODE_EXISTS, its inode and names, not
        its entries), and nothing orders the directory's own entry changes before that. So PATH
        may also name what a directory its parent may be, moved since PATH's floor, held under
        PATH's base name at any version since that floor (and since that entry's own floor),
        whatever the directory's path then."""
        parent = os.path.dirname(path)
        if not parent or self.semantics.holds("ordered-metadata"):
            return set()
        dirs = {i for i in self.candidates(parent, v)[0] if i is not None and self.h.inodes[i].kind == "dir"}
        changes = [pos for pos, _, touched in self.h.name_changes
                   if floor <= pos and (pos < v.n_done or pos + 1 in v.versions_after) and touched & dirs]
        moved = {d for pos in changes for d in dirs
                 if d in self.h.ns[pos].values() and d in self.h.ns[pos + 1].values()}
        if not moved:
            return set()  # each directory at one path all along: its entries are PATH's own versions
        base = os.path.basename(path)
        versions = {floor, *v.versions_after} | {pos + 1 for pos, _, _ in self.h.name_changes
                                                 if floor <= pos < v.n_done}
        out: set[int | None] = set()
        for k in versions:
            for q, i in self.h.ns[k].items():
                if i in moved and k >= self.name_floor(f"{q}/{base}", v)[0]:
                    out.add(self.h.ns[k].get(f"{q}/{base}"))
        return out

    def uncertain(self, path: str, v: PointView) -> bool:
        parts = path.split("/")
        prefixes = {"/".join(parts[:k]) for k in range(1, len(parts) + 1)}
        return bool(prefixes & (self.h.uncertain | v.fuzzy))

    def records_key(self, path: str, v: PointView) -> tuple[Any, ...]:
        """What check_records' result for PATH depends on besides the file's bytes."""
        out: list[Any] = []
        for upto in (v.n_done, last_allowed(v.allowed) + 1):
            i = self.index.inode_at(path, upto)
            out.append(None if i is None else self.index.inode_key(self.h.inodes[i], v))
        return tuple(out)
