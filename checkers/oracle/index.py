"""The history's lookups the model asks at every crash state, each computed once.

A crash state differs from the one before by a few ops, so what the model
needs of the history (an inode's persists, a path's name changes, an inode's
content after a prefix, its events indexed) is a pure function of the
history, memoised here: the model (checkers/oracle/model.py) asks, this
module remembers. Nothing here reads the crash image.
"""

from __future__ import annotations

import bisect

import numpy as np

from checkers.eventindex import EventIndex, PlainEvents, PointEvents
from checkers.history import History, Persist
from checkers.oracle.view import PointView
from checkers.timeline import Inode
from checkers.untorn import classified
from foundation.intervals import IntervalMap
from workloads.pattern import CHUNK


class HistoryIndex:

    def __init__(self, history: History) -> None:
        self.h = history
        self._inode_persists: dict[int, tuple[list[int], list[Persist]]] = {}
        self._name_changes: dict[str, tuple[list[int], list[int | None]]] = {}
        self._path_inodes: dict[str, tuple[list[int], list[int]]] = {}
        self._positions: dict[int, list[int]] = {}
        self._content_cache: dict[tuple[int, int], tuple[IntervalMap, int]] = {}
        self._last_content: dict[int, tuple[int, IntervalMap, int]] = {}  # ino -> its newest map (events, map, size)
        self._expected: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        # Each inode's events indexed once (checkers/eventindex.py), so that a file's check
        # does not filter its whole history at every state. False: the plain filter (reference).
        self.indexed = True
        self._event_index: dict[int, EventIndex] = {}
        self._classified = classified(history)

    def persists_of(self, ino: Inode) -> tuple[list[int], list[Persist]]:
        """The persists that can cover INO, in completion order, and their positions."""
        got = self._inode_persists.get(ino.ino)
        if got is None:
            mine = [p for p in self.h.persists if (p.ino is None or p.ino == ino.ino) and ino.created < p.prefix
                    and not p.names_only]
            got = self._inode_persists[ino.ino] = ([p.ex.pos for p in mine], mine)
        return got

    def name_changes_of(self, path: str) -> tuple[list[int], list[int | None]]:
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

    def inode_key(self, ino: Inode, v: PointView) -> tuple[int, int, int, tuple[int, ...]]:
        """Everything of the crash point a check of INO's content depends on: which of its
        persists had completed, which of its events had, and which are in flight."""
        positions, _ = self.persists_of(ino)
        events = self.event_positions(ino)
        k = bisect.bisect_left(events, v.n_done)
        flying = tuple(sorted(p for p in v.inflight if self.has_event(ino, p)))
        return ino.ino, bisect.bisect_left(positions, v.n_done), k, flying

    def has_event(self, ino: Inode, pos: int) -> bool:
        events = self.event_positions(ino)
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

    def content_at(self, ino: Inode, prefix: int) -> tuple[IntervalMap, int]:
        """ino.content_at(PREFIX), cached by how many of its events that prefix includes.
        Built from the newest earlier map of the inode when there is one: crash states
        come in crash-point order, so that applies only the events in between, not the
        whole history (fsync-under-load: ~300000 appends to a file). Cached maps are never
        changed; callers copy them."""
        k = bisect.bisect_left(self.event_positions(ino), prefix)
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

    def event_positions(self, ino: Inode) -> list[int]:
        got = self._positions.get(ino.ino)
        if got is None or len(got) != len(ino.events):
            got = self._positions[ino.ino] = [e.pos for e in ino.events]
        return got

    def expected_chunks(self, ino: Inode, n_done: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """For N whole chunks: where the content after the ops before N_DONE is one
        writer's whole chunk, and that writer's header fields (wid omitted)."""
        key = (ino.ino, bisect.bisect_left(self.event_positions(ino), n_done), n)
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
