"""The content oracle: is this recovered crash image a state the guarantees allow?

At a crash point the ops whose completion mark is in the log have returned;
one op per thread may be in flight; the rest never started. From the
history (checkers/history.py) and the rules (checkers/fsrules.py) this
computes, per path, which inodes it may name, and per inode, which sizes and
which writer of every byte are allowed; then it reads the mounted crash
image and reports only what no allowed state explains:

- `durability`: something a completed fsync/fdatasync/sync/O_SYNC write
  guaranteed is missing, older, or shorter;
- `stale-data`: bytes that were never written to that file at that offset;
- `atomicity`: a rename left neither the old nor the new state, or an
  RWF_ATOMIC write's range mixes its data with older data (checkers/untorn.py).

Whenever the model cannot be sure (paths it lost track of, ranges shifted by
collapse/insert after the last guarantee), it checks nothing there.
"""

from __future__ import annotations

import bisect
import copy
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from checkers.design import RecordsInvariant, check_records
from checkers.eventindex import Allowed, EventIndex, PlainEvents, PointEvents, last_allowed
from checkers.filememo import ImageFiles
from checkers.findings import Finding, is_host_error, read_error
from checkers.fsrules import RULES, Semantics, rule
from checkers.history import ROOT, Exec, History, Inode, Persist
from checkers.linux_names import NameIndex, observed_kind, order_gap
from checkers.untorn import WriteVerdict, classified, classify_file
from foundation.intervals import IntervalMap, Piece, Src, merge_ranges, subtract_ranges
from workloads.pattern import CHUNK, ChunkScan, decode_chunk, generate, scan_chunks

ZERO_CHUNK = bytes(CHUNK)


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


@dataclass
class PointView:
    """What the model allows at one crash point."""

    n_done: int                          # ops at positions < n_done had returned
    allowed: Allowed                     # done and in-flight positions
    versions_after: list[int]            # namespace versions beyond n_done reachable by in-flight ops
    fuzzy: set[str] = field(default_factory=set)   # paths an unreachable in-flight op touched
    inflight: frozenset[int] = frozenset()         # allowed positions >= n_done


class ContentOracle:
    def __init__(self, history: History, wid: int, fs: str, invariants: dict[str, Any] | None = None,
                 semantics: Semantics | None = None) -> None:
        self.h = history
        self.wid = wid
        self.fs = fs
        self.semantics = semantics or Semantics(fs=fs)
        self.names = NameIndex(history)
        self._ordered: dict[int, tuple[int, Persist | None]] = {}
        self.records = RecordsInvariant.from_workload(invariants or {})
        self.loss_rows: list[dict[str, Any]] = []  # one per crash point and recording file
        self.torn_rows: list[dict[str, Any]] = []  # one per crash state: classified writes, torn ones
        self._mark_positions = sorted((ex.mark, ex.pos) for ex in history.execs if ex.mark is not None)
        self._marks = [m for m, _ in self._mark_positions]
        self._content_cache: dict[tuple[int, int], tuple[IntervalMap, int]] = {}
        self._last_content: dict[int, tuple[int, IntervalMap, int]] = {}  # ino -> its newest map (events, map, size)
        self._positions: dict[int, list[int]] = {}
        self._inode_persists: dict[int, tuple[list[int], list[Persist]]] = {}
        self._name_floors: dict[str, tuple[list[int], list[tuple[int, Cover | None]]]] = {}
        self._expected: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._scans: dict[str, ChunkScan] = {}   # path -> its chunks at the last crash state checked
        self.bulk = True                         # False: the sector-by-sector reference check only
        # Files whose bytes did not change since the same worker's previous state are not read
        # again, and checks whose inputs (bytes, the model's expectations) are unchanged are
        # not redone (checkers/filememo.py). False: every file read and checked at every state.
        self.files = ImageFiles(fs)
        self._verdicts: dict[tuple[Any, ...], tuple[Finding | None, list[WriteVerdict]]] = {}
        self._records_memo: dict[tuple[Any, ...], tuple[dict[str, Any], list[Finding]]] = {}
        self._path_inodes: dict[str, tuple[list[int], list[int]]] = {}
        self._name_changes: dict[str, tuple[list[int], list[int | None]]] = {}
        # Each inode's events indexed once (checkers/eventindex.py), so that a file's check
        # does not filter its whole history at every state. False: the plain filter (reference).
        self.indexed = True
        self._event_index: dict[int, EventIndex] = {}
        self._classified = classified(history)
        # Per thread, its positions in program order when they ascend (the usual case):
        # the first unfinished op is then found by bisection.
        self._ascending = {t: ps == sorted(ps) for t, ps in history.threads.items()}
        self.seconds = 0.0                       # spent in inspect() (bench: the oracle's cost per state)
        self.states = 0
        self.all_paths = sorted({p for ns in history.ns for p in ns})

    # -- the crash point -----------------------------------------------------
    def view(self, crash_point: int) -> PointView:
        n_done = bisect.bisect_right(self._marks, crash_point)
        inflight = set()
        # The first unfinished op of each thread may be in flight (counting one
        # that had not started yet as in flight only allows more states).
        for t, positions in self.h.threads.items():
            if self._ascending[t]:
                k = bisect.bisect_left(positions, n_done)
                if k < len(positions):
                    inflight.add(positions[k])
                continue
            for pos in positions:
                if pos >= n_done:
                    inflight.add(pos)
                    break
        allowed = Allowed(n_done, frozenset(inflight))
        versions, fuzzy = [], set()
        for pos in sorted(inflight):
            if all(p in allowed for p in range(n_done, pos + 1)):
                versions.append(pos + 1)
            else:  # an op not yet started sits between: its names are not modelled here
                fuzzy |= {p for c_pos, paths, _ in self.h.name_changes if c_pos == pos for p in paths}
        return PointView(n_done, allowed, versions, fuzzy, allowed.inflight)

    # -- guarantees ------------------------------------------------------------
    def guarantee(self, ino: Inode, v: PointView) -> Guarantee | None:
        positions, mine = self._persists_of(ino)
        done = mine[:bisect.bisect_left(positions, v.n_done)]
        if not done:
            return None
        whole = max((p for p in done if p.range is None), key=lambda p: p.prefix, default=None)
        floor = whole.prefix if whole else -1
        base, size = self.content_at(ino, floor) if whole else (IntervalMap(), 0)
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
        metadata = whole if whole and whole.rule in ("fsync-data", "sync-all") else None
        return Guarantee(newest or done[-1], floor, content, ranges, size, metadata)

    def _persists_of(self, ino: Inode) -> tuple[list[int], list[Persist]]:
        """The persists that can cover INO, in completion order, and their positions."""
        got = self._inode_persists.get(ino.ino)
        if got is None:
            mine = [p for p in self.h.persists if (p.ino is None or p.ino == ino.ino) and ino.created < p.prefix]
            got = self._inode_persists[ino.ino] = ([p.ex.pos for p in mine], mine)
        return got

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
                    r = "sync-all" if p.ino is None else self.fsync_rule(p, path)
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
        ks, vals = self._name_changes_of(path)
        lo, hi = bisect.bisect_right(ks, floor), bisect.bisect_right(ks, v.n_done)
        got = {vals[lo - 1], *vals[lo:hi]} if floor <= v.n_done else set()  # versions in between change nothing
        return got | {self.h.ns[k].get(path) for k in v.versions_after}, floor, why

    def _name_changes_of(self, path: str) -> tuple[list[int], list[int | None]]:
        """The namespace versions at which PATH's inode changes (version 0 always), and the new values."""
        got = self._name_changes.get(path)
        if got is None:
            ks: list[int] = []
            vals: list[int | None] = []
            for k, ns in enumerate(self.h.ns):
                cur = ns.get(path)
                if not ks or cur != vals[-1]:
                    ks.append(k)
                    vals.append(cur)
            got = self._name_changes[path] = (ks, vals)
        return got

    @property
    def incremental(self) -> bool:
        return self.files.enabled

    @incremental.setter
    def incremental(self, on: bool) -> None:
        self.files.enabled = on and self.fs in ("ext4", "xfs")

    def inode_key(self, ino: Inode, v: PointView) -> tuple[int, int, int, tuple[int, ...]]:
        """Everything of the crash point a check of INO's content depends on: which of its
        persists had completed, which of its events had, and which are in flight."""
        positions, _ = self._persists_of(ino)
        events = self._event_positions(ino)
        k = bisect.bisect_left(events, v.n_done)
        flying = tuple(sorted(p for p in v.inflight if self._has_event(ino, p)))
        return ino.ino, bisect.bisect_left(positions, v.n_done), k, flying

    def _has_event(self, ino: Inode, pos: int) -> bool:
        events = self._event_positions(ino)
        k = bisect.bisect_left(events, pos)
        return k < len(events) and events[k] == pos

    def inode_at(self, path: str, upto: int) -> int | None:
        """The inode PATH named in the newest namespace version <= UPTO that has it
        (checkers/design.py written_records, without a walk over the versions)."""
        got = self._path_inodes.get(path)
        if got is None:
            ks, inos, prev = [], [], None
            for k, ns in enumerate(self.h.ns):
                cur = ns.get(path)
                if cur is not None and cur != prev:
                    ks.append(k)
                    inos.append(cur)
                prev = cur
            got = self._path_inodes[path] = (ks, inos)
        i = bisect.bisect_right(got[0], upto)
        return got[1][i - 1] if i else None

    def records_key(self, path: str, v: PointView) -> tuple[Any, ...]:
        """What check_records' result for PATH depends on besides the file's bytes."""
        out: list[Any] = []
        for upto in (v.n_done, last_allowed(v.allowed) + 1):
            i = self.inode_at(path, upto)
            out.append(None if i is None else self.inode_key(self.h.inodes[i], v))
        return tuple(out)

    def scan(self, path: str, data: bytes) -> ChunkScan:
        """PATH's chunks, reusing the verdicts of chunks unchanged since the last
        crash state checked (a crash state differs from the one before by a few writes)."""
        prev = self._scans.get(path)
        if prev is not None and prev.data is data:
            return prev
        got = scan_chunks(data, prev)
        self._scans[path] = got
        return got

    def content_at(self, ino: Inode, prefix: int) -> tuple[IntervalMap, int]:
        """ino.content_at(PREFIX), cached by how many of its events that prefix includes.
        Built from the newest earlier map of the inode when there is one: crash states
        come in crash-point order, so that applies only the events in between, not the
        whole history (fsync-under-load: ~300000 appends to a file). Cached maps are never
        changed; callers copy them."""
        k = bisect.bisect_left(self._event_positions(ino), prefix)
        key = (ino.ino, k)
        got = self._content_cache.get(key)
        if got is not None:
            return got
        last = self._last_content.get(ino.ino)
        if last is not None and last[0] <= k:
            m, size = ino.content_from(last[1].copy(), last[2], last[0], prefix)
        else:
            m, size = ino.content_at(prefix)
        if len(self._content_cache) > 1024:  # bounded: a long run would keep a map per state and file
            self._content_cache.clear()
        got = self._content_cache[key] = (m, size)
        if last is None or last[0] <= k:
            self._last_content[ino.ino] = (k, m, size)
        return got

    def point_events(self, ino: Inode, v: PointView, floor: int) -> PointEvents | PlainEvents:
        """INO's events allowed at V (`history`) and those at or after FLOOR (`later`)."""
        if not self.indexed:
            return PlainEvents(ino, v.allowed, floor, self._classified)
        idx = self._event_index.get(ino.ino)
        if idx is None or not idx.fresh(ino):
            idx = self._event_index[ino.ino] = EventIndex(ino, self._classified)
        return PointEvents(idx, v.allowed, floor)

    def _event_positions(self, ino: Inode) -> list[int]:
        got = self._positions.get(ino.ino)
        if got is None or len(got) != len(ino.events):
            got = self._positions[ino.ino] = [e.pos for e in ino.events]
        return got

    def expected_chunks(self, ino: Inode, n_done: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """For N whole chunks: where the content after the ops before N_DONE is one
        writer's whole chunk, and that writer's header fields (wid omitted)."""
        key = (ino.ino, bisect.bisect_left(self._event_positions(ino), n_done), n)
        got = self._expected.get(key)
        if got is not None:
            return got
        newest, _ = self.content_at(ino, n_done)
        writer = np.zeros(n, dtype=bool)
        partial = np.zeros(n, dtype=bool)
        exp = np.zeros(n, dtype=[("file_id", "<i8"), ("seq", "<i8"), ("iter", "<i8"), ("offset", "<i8")])
        for s, t, src in newest.pieces:
            if s >= n * CHUNK:
                break
            c0, c1 = -(-s // CHUNK), min(t // CHUNK, n)
            if c1 > c0:
                writer[c0:c1] = True
                exp["file_id"][c0:c1], exp["seq"][c0:c1], exp["iter"][c0:c1] = src.file_id, src.seq, src.iter
                exp["offset"][c0:c1] = np.arange(c0, c1, dtype=np.int64) * CHUNK - src.delta
            for edge in (s, t):
                if edge % CHUNK and edge // CHUNK < n:
                    partial[edge // CHUNK] = True
        writer &= ~partial
        if len(self._expected) > 256:
            self._expected.clear()
        self._expected[key] = (writer, exp)
        return writer, exp

    # -- checking the image ------------------------------------------------------
    def inspect(self, mnt: str, crash_point: int, state_id: str | None = None) -> list[Finding]:
        t0 = time.perf_counter()
        try:
            return self._inspect(mnt, crash_point, state_id)
        finally:
            self.seconds += time.perf_counter() - t0
            self.states += 1

    def _inspect(self, mnt: str, crash_point: int, state_id: str | None) -> list[Finding]:
        v = self.view(crash_point)
        out: list[Finding] = []
        self.files.begin(mnt)
        if self.records:
            try:
                memo = self._records_memo if self.incremental else None
                rows, design = check_records(self.records, self.h, self.wid, mnt, v.n_done, v.allowed, crash_point,
                                             scan=self.scan if self.bulk else None,
                                             read=lambda p: self.files.content(mnt, p),
                                             memo=memo, key=lambda p: (self.bulk, self.records_key(p, v)))
            except OSError as e:  # the recording file does not read back: no loss row for this state
                rows, design = [], [_read_error(e, mnt, "records")]
            self.loss_rows += [dict(r, state_id=state_id) if state_id else r for r in rows]
            out += design
        if self.h.lost:
            return self._finish(out, crash_point, state_id)
        skip_under: list[str] = []  # missing or unreadable: what is below is judged there
        unreadable = False
        verdicts: list[WriteVerdict] = []
        for path in self.all_paths:
            if self.uncertain(path, v) or any(path.startswith(d + "/") for d in skip_under):
                continue
            try:
                f = self.check_path(mnt, path, v, verdicts)
            except OSError as e:  # one path that does not read back; the others are still checked
                f, unreadable = _read_error(e, mnt, path), True
            if f is not None:
                if f.evidence.get("found") == "missing" or f.kind == "corruption":
                    skip_under.append(path)
                out.append(f)
        if verdicts:
            self.torn_rows.append(torn_row(verdicts, crash_point, state_id))
        if unreadable:  # the name-level checks would read the same broken image: nothing more to learn
            return self._finish(out, crash_point, state_id)
        try:
            out += self.check_renames(mnt, v)
            if not out:
                out += self.check_order(mnt, v)
        except OSError as e:
            out.append(_read_error(e, mnt, "the names"))
        return self._finish(out, crash_point, state_id)

    def _finish(self, out: list[Finding], crash_point: int, state_id: str | None) -> list[Finding]:
        for f in out:
            f.crash_point = crash_point
            r = f.evidence.get("rule")
            if r in RULES:
                f.evidence.setdefault("tier", RULES[r].tier)
            if state_id:
                f.evidence["state_id"] = state_id
        return out

    def uncertain(self, path: str, v: PointView) -> bool:
        parts = path.split("/")
        prefixes = {"/".join(parts[:k]) for k in range(1, len(parts) + 1)}
        return bool(prefixes & (self.h.uncertain | v.fuzzy))

    def check_path(self, mnt: str, path: str, v: PointView, verdicts: list[WriteVerdict] | None = None) -> Finding | None:
        cands, floor, why = self.candidates(path, v)
        full = os.path.join(mnt, path)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            st = None
        except NotADirectoryError:
            st = None
        if st is None:
            parent = os.path.dirname(full)
            if None in cands or not os.path.isdir(parent):
                return None  # a missing parent is judged at the parent's own path
            return self.name_finding(path, floor, why, v, "missing")
        inodes = [self.h.inodes[i] for i in cands if i is not None]
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else "file"
        same = [i for i in inodes if i.kind == kind]
        if not same:
            if not inodes and not any(self.h.ns[k].get(path) for k in range(v.n_done + 1)):
                return Finding("stale-data", f"{path} exists before any op created it",
                               evidence={"path": path, "rule": "no-stale-data", "found": kind,
                                         "reference": rule("no-stale-data").reference})
            if not inodes:
                return self.name_finding(path, floor, why, v, f"a {kind} that was removed")
            return self.name_finding(path, floor, why, v, f"a {kind}, not a {inodes[0].kind}")
        if kind == "symlink":
            target = os.readlink(full)
            if any(i.target == target for i in same):
                return None
            return Finding("stale-data", f"{path}: symlink points to {target!r}, never a target of it",
                           evidence={"path": path, "rule": "no-stale-data", "expected": [i.target for i in same],
                                     "found": target})
        if kind == "file":
            return self.check_file(mnt, path, same, v, verdicts) or self.check_metadata(full, path, same, st, v)
        return None

    def name_finding(self, path: str, floor: int, why: Cover | None, v: PointView, found: str) -> Finding:
        renames = [pos for pos, paths, _ in self.h.name_changes
                   if floor <= pos and pos in v.allowed and path in paths
                   and self.h.execs[pos].kind == "rename"]
        if renames and found == "missing":
            ex = self.h.execs[renames[0]]
            return Finding("atomicity", f"{path} is missing after {ex.describe()}: rename must leave the old or the new file",
                           evidence={"path": path, "rule": "rename-atomic", "op": ex.describe(),
                                     "op_mark": ex.mark, "expected": "present", "found": found,
                                     "reference": rule("rename-atomic").reference})
        if why is None:  # no guarantee, yet a state the path never had: a kind it never was
            return Finding("stale-data", f"{path} is {found}, which it never was",
                           evidence={"path": path, "rule": "no-stale-data", "found": found,
                                     "reference": rule("no-stale-data").reference})
        r = why.rule
        if found != "missing" and r == "sync-all":
            r = "no-resurrection"
        expected = "absent" if None in {self.h.ns[floor].get(path)} else "present"
        return Finding("durability", f"{path} is {found}, but {why.ex.describe()} made it {expected}: {rule(r).promise}",
                       evidence={"path": path, "rule": r, "op": why.ex.describe(), "op_mark": why.ex.mark,
                                 "expected": expected, "found": found, "reference": rule(r).reference})

    # -- file content ------------------------------------------------------------
    def check_file(self, mnt: str, path: str, inodes: list[Inode], v: PointView,
                   verdicts: list[WriteVerdict] | None = None) -> Finding | None:
        data, token = self.files.content(mnt, path)
        key = (path, token, self.bulk, tuple(self.inode_key(i, v) for i in inodes)) if self.incremental else None
        hit = self._verdicts.get(key) if key is not None else None
        if hit is None:
            hit = self._check_file(data, path, inodes, v)
            if key is not None:
                if len(self._verdicts) > 4096:
                    self._verdicts.clear()
                self._verdicts[key] = hit
        problem, classified = hit
        if verdicts is not None:
            verdicts += classified
        return copy.deepcopy(problem)

    def _check_file(self, data: bytes, path: str, inodes: list[Inode],
                    v: PointView) -> tuple[Finding | None, list[WriteVerdict]]:
        """The first inode's finding (None: one of INODES explains DATA) and the classified writes."""
        classified: list[WriteVerdict] = []
        scan = self.scan(path, data) if self.bulk else None
        first: Finding | None = None
        for ino in inodes:
            fc = FileCheck(self, ino, v)
            problem = fc.check(data, scan)
            if problem is None or problem.kind == "atomicity":
                classified += fc.verdicts  # the torn-write count covers what the finding is about too
            if problem is None:
                return None, classified
            first = first or problem
        assert first is not None
        first.detail = f"{path}: {first.detail}"
        first.evidence["path"] = path
        return first, classified

    def check_metadata(self, full: str, path: str, inodes: list[Inode], st: os.stat_result,
                       v: PointView) -> Finding | None:
        """Link count and xattrs, where one inode is possible and fsync/sync made them durable."""
        if len(inodes) != 1:
            return None
        ino = inodes[0]
        g = self.guarantee(ino, v)
        if g is None or g.metadata is None:
            return None
        q = g.metadata.prefix
        if self.semantics.holds("fallocate-fsync"):
            short = self.allocation_shortfall(full, ino, q, st)
            if short is not None:
                return self.meta_finding(path, g, "allocation", short[0], short[1], "fallocate-fsync")
        later = [pos for pos, _, inos in self.h.name_changes if pos >= q and pos in v.allowed and ino.ino in inos]
        if g.metadata.ino is None and not later:  # sync: the names, so the link count, are durable
            want = sum(1 for i in self.h.ns[q].values() if i == ino.ino)
            if want and st.st_nlink != want:
                return self.meta_finding(path, g, "link count", want, st.st_nlink)
        changed = {name for pos, x in ino.xattrs if pos >= q and pos in v.allowed for name in x} | {
            name for pos, x in ino.xattrs if pos >= q and pos in v.allowed
            for name in ino.xattrs_at(pos)}  # set or removed after the guarantee: either state
        durable = ino.xattrs_at(q)
        try:
            present = {n for n in os.listxattr(full) if n.startswith("user.")}
        except OSError:
            return None
        for name, (file_id, seq, it, length) in durable.items():
            if name in changed:
                continue
            if name not in present:
                return self.meta_finding(path, g, f"xattr {name}", "present", "missing")
            want_v = generate(self.wid, file_id, seq, it, 0, length)
            if os.getxattr(full, name) != want_v:
                return self.meta_finding(path, g, f"xattr {name}", f"value of op {seq}", "another value")
        for name in present - set(durable) - changed:
            if any(name in x for _, x in ino.xattrs):  # removed before the guarantee, back again
                return self.meta_finding(path, g, f"xattr {name}", "absent", "present")
        return None

    def allocation_shortfall(self, full: str, ino: Inode, q: int, st: os.stat_result) -> tuple[str, str] | None:
        """fallocate-fsync: blocks fallocate reserved before the guarantee at Q
        must still be allocated; (expected, found) if fewer are. Checked only
        while nothing since the first fallocate could free blocks: a punch or
        a truncate, to any size (ext4 drops blocks past EOF on truncate)."""
        allocs = [e for e in ino.events if e.kind == "alloc" and e.pos < q]
        if not allocs:
            return None
        first = allocs[0].pos
        if any(e.kind in ("zero", "size", "collapse", "insert") and e.pos > first for e in ino.events):
            return None
        # Data written into a reserved range may be placed elsewhere (btrfs
        # compress-force writes copy-on-write): only untouched reservations count.
        if any(e.kind in ("data", "maybe") and e.pos > first and any(a.start < e.end and e.start < a.end for a in allocs)
               for e in ino.events):
            return None
        bsize = os.statvfs(full).f_bsize
        whole = [(-(-e.start // bsize) * bsize, e.end // bsize * bsize) for e in allocs]
        want = sum(t - s for s, t in merge_ranges([(s, t) for s, t in whole if t > s]))
        have = st.st_blocks * 512
        if have >= want:
            return None
        return f"at least {want} bytes allocated", f"{have} bytes allocated"

    def meta_finding(self, path: str, g: Guarantee, what: str, expected: Any, found: Any,
                     rule_name: str | None = None) -> Finding:
        p = g.metadata
        assert p is not None
        r = rule_name or p.rule
        return Finding("durability", f"{path}: {what} is {found}, but {p.ex.describe()} made it {expected}",
                       evidence={"path": path, "rule": r, "op": p.ex.describe(), "op_mark": p.ex.mark,
                                 "expected": str(expected), "found": str(found),
                                 "reference": rule(r).reference})

    # -- ordering (linux tier, ext4 and xfs) ----------------------------------------
    def check_order(self, mnt: str, v: PointView) -> list[Finding]:
        """ordered-metadata: the recovered names must be those after one prefix of
        the namespace ops. Only single-threaded workloads: ops of two threads
        that overlap in time have no order to keep."""
        if not self.semantics.holds("ordered-metadata") or len(self.h.threads) != 1:
            return []
        floor = max([self.ordered_floor(v)[0]] + [p.prefix for p in self.h.persists
                                                   if p.ino is None and p.ex.pos < v.n_done])
        versions = list(range(floor, v.n_done + 1)) + v.versions_after
        seen = {p: observed_kind(mnt, p) for p in self.all_paths if not self.uncertain(p, v)}
        gap = order_gap(self.h, seen, versions)
        if gap is None:
            return []
        late, early = self.h.execs[gap.late_pos], self.h.execs[gap.early_pos]
        what = (f"{gap.late_path} shows the result of {late.describe()}, but {gap.early_path} lacks that "
                f"of {early.describe()}" + (" (the same op, half applied)" if late is early else ", done before it"))
        r = rule("ordered-metadata")
        return [Finding("durability", f"no prefix of the completed namespace ops explains the names: {what}",
                        evidence={"path": gap.early_path, "rule": r.name, "op": early.describe(),
                                  "op_mark": early.mark, "expected": f"{gap.early_path} as after {early.describe()}",
                                  "found": f"{gap.early_path} {seen[gap.early_path] or 'missing'}, "
                                           f"{gap.late_path} {seen[gap.late_path] or 'missing'}",
                                  "reference": r.reference})]

    # -- renames -------------------------------------------------------------------
    def check_renames(self, mnt: str, v: PointView) -> list[Finding]:
        """rename-atomic, the half per-path checks cannot see: the renamed file
        must be at the old or the new name, never lost between them."""
        out = []
        for pos, paths, _ in self.h.name_changes:
            ex = self.h.execs[pos]
            if ex.kind != "rename" or pos not in v.allowed or ex.f("flags"):
                continue
            src, dst = ex.f("from"), ex.f("to")
            if {src, dst} & self.h.uncertain or self.uncertain(src, v) or self.uncertain(dst, v):
                continue
            moved = self.h.ns[pos].get(src)
            if moved is None or self.h.inodes[moved].kind != "file":
                continue
            floor, _ = self.name_floor(src, v)
            later = [p for p, ps, _ in self.h.name_changes if p > pos and p in v.allowed and ps & {src, dst}]
            if floor > pos or self.h.ns[floor].get(src) != moved or later:
                continue  # the old name was not durable, or later ops muddle it
            if os.path.lexists(os.path.join(mnt, src)):
                continue
            ino = self.h.inodes[moved]
            dpath = os.path.join(mnt, dst)
            if os.path.isfile(dpath) and not os.path.islink(dpath):
                with open(dpath, "rb") as f:
                    if FileCheck(self, ino, v).check(f.read()) is None:
                        continue
            out.append(Finding("atomicity", f"the file renamed by {ex.describe()} is neither at {src} nor at {dst}",
                               evidence={"path": dst, "rule": "rename-atomic", "op": ex.describe(), "op_mark": ex.mark,
                                         "expected": f"{src} or {dst} holds the renamed file",
                                         "found": f"{src} missing, {dst} " + ("missing" if not os.path.lexists(dpath)
                                                                              else "holds other data"),
                                         "reference": rule("rename-atomic").reference}))
        return out


class FileCheck:
    """One inode's allowed sizes and bytes at a crash point, checked against a file's content."""

    def __init__(self, oracle: ContentOracle, ino: Inode, v: PointView) -> None:
        self.o = oracle
        self.ino = ino
        self.v = v
        self.g = oracle.guarantee(ino, v)
        floor = self.g.floor if self.g else -1
        # the allowed events (`history`), those at or after the floor (`later`): by index, not a walk
        self.events = oracle.point_events(ino, v, floor)
        self.shifted = bool(self.events.later_of("collapse") or self.events.later_of("insert"))
        self.verdicts: list[WriteVerdict] = []  # the classified writes (checkers/untorn.py), once checked
        # failed writes that may have left bytes behind: allowed at any time after they ran
        self.maybe = self.events.history_of("maybe")
        self._zeroed: list[tuple[int, int]] | None = None

    def zeroed(self) -> list[tuple[int, int]]:
        """The ranges `later` zero events cover."""
        if self._zeroed is None:
            self._zeroed = [(e.start, e.end) for e in self.events.later_of("zero")]
        return self._zeroed

    def size_range(self) -> tuple[int, int]:
        later = self.events.later_sizes()
        sizes = list(later) if later else []
        top = max([e.end for e in self.maybe], default=0)  # a failed write past EOF: not ruled out
        if self.g is None:
            return 0, max(sizes + [top])
        sizes.append(self.g.size)
        return min(sizes), max(sizes + [top])

    def check(self, data: bytes, scan: ChunkScan | None = None) -> Finding | None:
        """The first sector (by offset) no allowed state explains, as a finding.
        With SCAN (the bulk check), whole chunks that bulk_ok() accepts are not
        looked at one by one: it accepts only what sector_ok() accepts."""
        if self.shifted:
            return None  # ranges moved after the last guarantee: not modelled precisely
        lo, hi = self.size_range()
        size = len(data)
        if size < lo:
            return self.finding("durability", f"size {size}, but {self.g.persist.ex.describe()} "  # type: ignore[union-attr]
                                f"made size {self.g.size} durable and no later op shrank it below {lo}",  # type: ignore[union-attr]
                                expected=f"size in [{lo}, {hi}]", found=f"size {size}")
        offsets: Iterable[int] = range(0, size, CHUNK)
        if scan is not None:
            suspects = np.flatnonzero(~self.bulk_ok(scan)).tolist() + ([scan.n] if size % CHUNK else [])
            offsets = [c * CHUNK for c in suspects]
        for off in offsets:
            sector = data[off:off + CHUNK]
            if not self.sector_ok(off, sector):
                return self.sector_finding(off, sector)
        if size > hi and any(data[hi:]):
            return self.finding("stale-data", f"size {size} is larger than the file ever was ({hi}) and holds data there",
                                expected=f"size <= {hi}", found=f"size {size}")
        self.verdicts = classify_file(self.o.h, self.o.wid, self.events, data)
        torn = next((w for w in self.verdicts if w.torn and w.untorn_promised), None)
        if not self.o.semantics.holds("untorn-write"):
            return None
        return self.untorn_finding(torn) if torn else None

    def untorn_finding(self, w: WriteVerdict) -> Finding:
        e = w.event
        span = lambda rs: ", ".join(f"{s}..{t}" for s, t in rs)  # noqa: E731
        r = rule("untorn-write")
        return Finding("atomicity", f"bytes {e.start}..{e.end} of {w.ex.describe()} are torn: "
                       f"{span(w.new)} hold its data, {span(w.old)} older data ({r.promise})",
                       evidence={"rule": r.name, "op": w.ex.describe(), "op_mark": w.ex.mark,
                                 "range": [e.start, e.end], "new_ranges": w.new, "old_ranges": w.old,
                                 "writers": {"new": f"op {e.src.seq} iter {e.src.iter}" if e.src else "zeros",
                                             "old": w.old_writers},
                                 "expected": f"all of {e.start}..{e.end} from op {e.src.seq if e.src else '?'}, or none of it",
                                 "found": f"new {span(w.new)}; old {span(w.old)}",
                                 "offset": w.old[0][0], "reference": r.reference})

    # -- all whole chunks at once ----------------------------------------------------
    def bulk_ok(self, scan: ChunkScan) -> np.ndarray:
        """Per whole chunk, True where sector_ok() is sure to hold, by two sufficient
        conditions: the chunk is exactly the content after the completed ops
        (whole chunks of one writer: header and CRC), or all zeros where
        zero_ok() holds. Everything else is left to sector_ok()."""
        n = scan.n
        expect, exp = self.o.expected_chunks(self.ino, self.v.n_done, n)
        h = scan.heads
        writer = expect & scan.valid & (h["wid"] == self.o.wid)
        for name in ("file_id", "seq", "iter", "offset"):
            writer &= h[name].astype(np.int64) == exp[name]
        # zero_ok(): zeros are allowed unless guaranteed data not zeroed later is there.
        zero = scan.zero.copy()
        durable = [(s, t) for s, t, _ in self.durable_pieces(0, n * CHUNK) or ()]
        zeroed = merge_ranges(self.zeroed())
        for s, t in subtract_ranges(merge_ranges(durable), zeroed):
            zero[s // CHUNK:-(-t // CHUNK)] = False
        return writer | zero

    # -- one sector -----------------------------------------------------------------
    def guaranteed_parts(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) the guarantee covers."""
        if self.g is None:
            return []
        return merge_ranges([(max(s, start), min(t, end)) for s, t in self.g.ranges if s < end and t > start])

    def durable_pieces(self, start: int, end: int) -> list[Piece] | None:
        """Guaranteed content of [start, end) (zeros omitted), None: no guarantee there."""
        parts = self.guaranteed_parts(start, end)
        if not parts:
            return None
        return [pc for s, t in parts for pc in self.g.content.get(s, t)]  # type: ignore[union-attr]

    def zero_ok(self, start: int, end: int) -> bool:
        pieces = self.durable_pieces(start, end)
        if not pieces:
            return True
        zeros = self.zeroed()
        return all(covered(s, t, zeros) for s, t, _ in pieces)

    def sector_ok(self, off: int, sector: bytes) -> bool:
        end = off + len(sector)
        if sector == ZERO_CHUNK[:len(sector)]:
            if self.zero_ok(off, end):
                return True
        elif len(sector) == CHUNK:
            info = decode_chunk(sector)
            if info is not None and info.wid == self.o.wid and self.whole_writer_ok(off, info):
                return True
        return self.bytes_ok(off, sector, self.allowed_layers(off, end, strict=True))

    def whole_writer_ok(self, off: int, info: Any) -> bool:
        """A whole chunk of one writer: allowed if that writer's allowed write covers the sector."""
        key = (info.file_id, info.seq, info.iter)
        for e in self.events.writer_events(key):
            if e.start <= off and off + CHUNK <= e.end and off - e.src.delta == info.offset:
                return True
        for s, t, src in self.durable_pieces(off, off + CHUNK) or ():
            if (src.file_id, src.seq, src.iter) == key and s <= off and off + CHUNK <= t and off - src.delta == info.offset:
                return True
        return False

    def allowed_layers(self, start: int, end: int, strict: bool) -> list[list[tuple[int, int, Src | None]]]:
        """Layers of candidate content for [start, end): each byte may come from any
        layer covering it. STRICT: the guarantee applies; else any past content."""
        parts = self.guaranteed_parts(start, end) if strict else []
        # Outside the guarantee anything goes back to zeros; inside, the
        # guaranteed content (holes are zeros).
        base: list[tuple[int, int, Src | None]] = []
        cur = start
        for s, t in parts:
            if s > cur:
                base.append((cur, s, None))
            covered_to = s
            for a, b, src in self.g.content.get(s, t):  # type: ignore[union-attr]
                if a > covered_to:
                    base.append((covered_to, a, None))
                base.append((a, b, src))
                covered_to = b
            if covered_to < t:
                base.append((covered_to, t, None))
            cur = t
        if cur < end:
            base.append((cur, end, None))
        layers = [base]
        for e in self.events.layer_events(start, end, strict):
            layers.append([(max(e.start, start), min(e.end, end), e.src)])
        return layers

    def bytes_ok(self, off: int, sector: bytes, layers: list[list[tuple[int, int, Src | None]]]) -> bool:
        ok = bytearray(len(sector))
        for layer in layers:
            for s, t, src in layer:
                want = bytes(t - s) if src is None else generate(self.o.wid, src.file_id, src.seq, src.iter,
                                                                 s - src.delta, t - s)
                got = sector[s - off:t - off]
                for i, (a, b) in enumerate(zip(got, want)):
                    if a == b:
                        ok[s - off + i] = 1
        return all(ok)

    def sector_finding(self, off: int, sector: bytes) -> Finding:
        end = off + len(sector)
        old = self.bytes_ok(off, sector, self.allowed_layers(off, end, strict=False)) or sector == ZERO_CHUNK[:len(sector)]
        if old and self.g is not None and self.durable_pieces(off, end) is not None:
            return self.finding("durability", f"bytes {off}..{end} are older than what "
                                f"{self.g.persist.ex.describe()} made durable",
                                expected=self.describe_expected(off, end), found=describe_bytes(sector), offset=off,
                                hexdump=hexdump(sector))
        info = decode_chunk(sector) if len(sector) == CHUNK else None
        what = (f"a chunk written by op {info.seq} iter {info.iter} at file offset {info.offset} of pattern file "
                f"{info.file_id}" if info else "data that no op wrote there")
        return self.finding("stale-data", f"bytes {off}..{end} hold {what}",
                            expected=self.describe_expected(off, end), found=describe_bytes(sector), offset=off,
                            hexdump=hexdump(sector), rule_name="no-stale-data")

    def describe_expected(self, start: int, end: int) -> str:
        names = []
        for layer in self.allowed_layers(start, end, strict=True):
            for s, t, src in layer:
                names.append(f"{s}..{t}: " + ("zeros" if src is None else f"op {src.seq} iter {src.iter}"))
        return "; ".join(dict.fromkeys(names))

    def finding(self, kind: str, detail: str, *, expected: str, found: str, rule_name: str | None = None,
                **extra: Any) -> Finding:
        r = rule_name or (self.g.persist.rule if self.g else "no-stale-data")
        ev: dict[str, Any] = {"rule": r, "expected": expected, "found": found, "reference": rule(r).reference, **extra}
        if self.g is not None:
            ev["op"] = self.g.persist.ex.describe()
            ev["op_mark"] = self.g.persist.ex.mark
        return Finding(kind, detail, evidence=ev)


def torn_row(verdicts: list[WriteVerdict], crash_point: int, state_id: str | None) -> dict[str, Any]:
    """One crash state's torn-write count (report.json `torn_writes`)."""
    torn = [w for w in verdicts if w.torn]
    return {"state_id": state_id or f"p{crash_point}", "crash_point": crash_point, "writes": len(verdicts),
            "torn": len(torn), "torn_untorn": sum(w.untorn_promised for w in torn),
            "writes_untorn": sum(w.untorn_promised for w in verdicts),
            "torn_ops": [w.ex.describe() for w in torn][:8]}


def covered(start: int, end: int, ranges: Iterable[tuple[int, int]]) -> bool:
    """Whether the union of RANGES covers [start, end)."""
    cur = start
    for s, t in sorted(ranges):
        if s > cur:
            break
        cur = max(cur, t)
        if cur >= end:
            return True
    return cur >= end


def describe_bytes(b: bytes) -> str:
    if not any(b):
        return "zeros"
    info = decode_chunk(b) if len(b) == CHUNK else None
    if info:
        return f"chunk of op {info.seq} iter {info.iter}, pattern file {info.file_id}, written for offset {info.offset}"
    return "data without a valid chunk header"


def hexdump(b: bytes, n: int = 64) -> str:
    return " ".join(f"{x:02x}" for x in b[:n])


def _read_error(e: OSError, mnt: str, what: str) -> Finding:
    """A `corruption` finding for a read of the recovered image that failed while checking WHAT."""
    if is_host_error(e):
        raise e
    return read_error(e, mnt, what)
