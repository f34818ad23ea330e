"""Reads a recovered crash image and asks the model whether what it holds is allowed.

Walks every path the workload named: its kind, a symlink's target, a file's
bytes (checkers/oracle/filecheck.py) and metadata (metadata.py), then the
names as a whole (names.py); the records invariant (checkers/design.py) and
the torn-write count are gathered on the way. What is allowed comes from
checkers/oracle/model.py; results reused between crash states from memo.py
and checkers/filememo.py.

Three switches select a fast path or the reference it must agree with (the
tests compare them): `bulk` (whole chunks at once, or sector by sector),
`indexed` (each inode's events indexed, or filtered), `incremental` (unchanged
files and checks reused, or everything read and checked at every state).
"""

from __future__ import annotations

import copy
import os
import stat
import time
from typing import Any

from checkers.design import RecordsInvariant, check_records
from checkers.filememo import ImageFiles
from checkers.findings import Finding, is_host_error, read_error
from checkers.fsrules import RULES, Semantics, rule
from checkers.history import History
from checkers.oracle.filecheck import FileCheck
from checkers.oracle.memo import CheckMemo, FileVerdict
from checkers.oracle.metadata import check_metadata
from checkers.oracle.model import Model
from checkers.oracle.names import check_order, check_renames, name_finding
from checkers.oracle.view import PointView
from checkers.timeline import Inode
from checkers.untorn import WriteVerdict


class ContentOracle:

    def __init__(self, history: History, wid: int, fs: str, invariants: dict[str, Any] | None = None,
                 semantics: Semantics | None = None) -> None:
        self.h = history
        self.wid = wid
        self.fs = fs
        self.model = Model(history, wid, semantics or Semantics(fs=fs))
        self.records = RecordsInvariant.from_workload(invariants or {})
        self.loss_rows: list[dict[str, Any]] = []  # one per crash point and recording file
        self.torn_rows: list[dict[str, Any]] = []  # one per crash state: classified writes, torn ones
        self.bulk = True                         # False: the sector-by-sector reference check only
        # Files whose bytes did not change since the same worker's previous state are not read
        # again, and checks whose inputs (bytes, the model's expectations) are unchanged are
        # not redone (checkers/filememo.py, checkers/oracle/memo.py). False: every file read
        # and checked at every state.
        self.files = ImageFiles(fs)
        self.memo = CheckMemo()
        self.seconds = 0.0                       # spent in inspect() (bench: the oracle's cost per state)
        self.states = 0

    @property
    def incremental(self) -> bool:
        return self.files.enabled

    @incremental.setter
    def incremental(self, on: bool) -> None:
        self.files.enabled = on and self.fs in ("ext4", "xfs")

    @property
    def indexed(self) -> bool:
        return self.model.index.indexed

    @indexed.setter
    def indexed(self, on: bool) -> None:
        self.model.index.indexed = on

    # -- checking the image ------------------------------------------------------
    def inspect(self, mnt: str, crash_point: int, state_id: str | None = None) -> list[Finding]:
        t0 = time.perf_counter()
        try:
            return self._inspect(mnt, crash_point, state_id)
        finally:
            self.seconds += time.perf_counter() - t0
            self.states += 1

    def _inspect(self, mnt: str, crash_point: int, state_id: str | None) -> list[Finding]:
        v = self.model.view(crash_point)
        out: list[Finding] = []
        self.files.begin(mnt)
        if self.records:
            try:
                memo = self.memo.records if self.incremental else None
                rows, design = check_records(self.records, self.h, self.wid, mnt, v.n_done, v.allowed, crash_point,
                                             scan=self.memo.scan if self.bulk else None,
                                             read=lambda p: self.files.content(mnt, p),
                                             memo=memo, key=lambda p: (self.bulk, self.model.records_key(p, v)),
                                             written=self.memo.written if self.incremental else None)
            except OSError as e:  # the recording file does not read back: no loss row for this state
                rows, design = [], [_read_error(e, mnt, "records")]
            self.loss_rows += [dict(r, state_id=state_id) if state_id else r for r in rows]
            out += design
        if self.h.lost:
            return self._finish(out, crash_point, state_id)
        skip_under: list[str] = []  # missing or unreadable: what is below is judged there
        unreadable = False
        verdicts: list[WriteVerdict] = []
        for path in self.model.all_paths:
            if self.model.uncertain(path, v) or any(path.startswith(d + "/") for d in skip_under):
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
            out += check_renames(self.model, mnt, v)
            if not out:
                out += check_order(self.model, mnt, v)
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

    def check_path(self, mnt: str, path: str, v: PointView, verdicts: list[WriteVerdict] | None = None) -> Finding | None:
        cands, floor, why = self.model.candidates(path, v)
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
            return name_finding(self.model, path, floor, why, v, "missing")
        inodes = [self.h.inodes[i] for i in cands if i is not None]
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else "file"
        same = [i for i in inodes if i.kind == kind]
        if not same:
            if not inodes and not any(self.h.ns[k].get(path) for k in range(v.n_done + 1)):
                return Finding("stale-data", f"{path} exists before any op created it",
                               evidence={"path": path, "rule": "no-stale-data", "found": kind,
                                         "reference": rule("no-stale-data").reference})
            if not inodes:
                return name_finding(self.model, path, floor, why, v, f"a {kind} that was removed")
            return name_finding(self.model, path, floor, why, v, f"a {kind}, not a {inodes[0].kind}")
        if kind == "symlink":
            target = os.readlink(full)
            if any(i.target == target for i in same):
                return None
            return Finding("stale-data", f"{path}: symlink points to {target!r}, never a target of it",
                           evidence={"path": path, "rule": "no-stale-data", "expected": [i.target for i in same],
                                     "found": target})
        if kind == "file":
            return self.check_file(mnt, path, same, v, verdicts) or check_metadata(self.model, full, path, same, st, v)
        return None


    # -- file content ------------------------------------------------------------
    def check_file(self, mnt: str, path: str, inodes: list[Inode], v: PointView,
                   verdicts: list[WriteVerdict] | None = None) -> Finding | None:
        data, token = self.files.content(mnt, path)
        index = self.model.index
        key = (path, token, self.bulk, tuple(index.inode_key(i, v) for i in inodes)) if self.incremental else None
        problem, classified = self.memo.file_verdict(key, lambda: self._check_file(data, path, inodes, v))
        if verdicts is not None:
            verdicts += classified
        return copy.deepcopy(problem)

    def _check_file(self, data: bytes, path: str, inodes: list[Inode],
                    v: PointView) -> FileVerdict:
        """The first inode's finding (None: one of INODES explains DATA) and the classified writes."""
        classified: list[WriteVerdict] = []
        scan = self.memo.scan(path, data) if self.bulk else None
        first: Finding | None = None
        for ino in inodes:
            fc = FileCheck(self.model, ino, v)
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


def torn_row(verdicts: list[WriteVerdict], crash_point: int, state_id: str | None) -> dict[str, Any]:
    """One crash state's torn-write count (report.json `torn_writes`)."""
    torn = [w for w in verdicts if w.torn]
    return {"state_id": state_id or f"p{crash_point}", "crash_point": crash_point, "writes": len(verdicts),
            "torn": len(torn), "torn_untorn": sum(w.untorn_promised for w in torn),
            "writes_untorn": sum(w.untorn_promised for w in verdicts),
            "torn_ops": [w.ex.describe() for w in torn][:8]}


def _read_error(e: OSError, mnt: str, what: str) -> Finding:
    """A `corruption` finding for a read of the recovered image that failed while checking WHAT."""
    if is_host_error(e):
        raise e
    return read_error(e, mnt, what)
