"""Design invariants a workload declares, checked at every crash point.

`"invariants": {"records": {"path": P or [P, ...], "record_bytes": B,
"period_us": T, "max_loss_records": N, "max_loss_ms": M}}` describes a
periodic recorder writing fixed-size records to P. At each crash point:

- records must come back as a prefix of whole records: every record before
  the last one holding any data is exactly what its write wrote (no torn or
  foreign record inside the surviving prefix). The last one may be torn (a
  write not yet fully on the device when the power went): it is reported
  as `torn_tail`, not as a finding;
- the loss window is records written (their write had returned) minus
  records recovered intact from the start, in records and in ms of
  recording (x period); over a declared maximum it is a `design` finding.
"""

from __future__ import annotations

import bisect
import copy
import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from checkers.eventindex import Allowed, last_allowed
from checkers.findings import Finding
from checkers.history import History
from workloads.pattern import CHUNK, ChunkScan, decode_chunk


@dataclass(frozen=True)
class RecordsInvariant:
    paths: tuple[str, ...]
    record_bytes: int
    period_us: int
    max_loss_records: int | None = None
    max_loss_ms: float | None = None

    @classmethod
    def from_workload(cls, invariants: dict[str, Any]) -> "RecordsInvariant | None":
        spec = invariants.get("records")
        if not spec:
            return None
        paths = spec["path"] if isinstance(spec["path"], list) else [spec["path"]]
        return cls(tuple(paths), int(spec["record_bytes"]), int(spec.get("period_us", 0)),
                   spec.get("max_loss_records"), spec.get("max_loss_ms"))


WrittenMemo = dict[tuple[Any, ...], dict[int, tuple[int, int, int, int]]]


def written_records(h: History, path: str, positions: Allowed | set[int], record_bytes: int,
                    upto: int, memo: WrittenMemo | None = None) -> dict[int, tuple[int, int, int, int]]:
    """Record index -> (file_id, seq, iter, delta) of the write (at one of
    POSITIONS) that wrote it whole, for the file at PATH after ops < UPTO.
    MEMO: results by inputs, shared by the states of one crash point (and any other
    with the same positions): the walk over the file's events costs O(its history)."""
    ino_id = None
    for k in range(min(upto, len(h.ns) - 1), -1, -1):   # (no slice of h.ns: O(history) a call)
        if path in h.ns[k]:
            ino_id = h.ns[k][path]
            break
    if ino_id is None:
        return {}
    key = None
    if memo is not None:
        pos_key = (positions.n_done, positions.inflight) if isinstance(positions, Allowed) else frozenset(positions)
        key = (path, ino_id, pos_key, record_bytes)
        hit = memo.get(key)
        if hit is not None:
            return hit
    out = {}
    for e in h.inodes[ino_id].events:
        if e.kind != "data" or e.pos not in positions:
            continue
        for r in range(-(-e.start // record_bytes), e.end // record_bytes):
            if (r + 1) * record_bytes <= e.end:
                out[r] = (e.src.file_id, e.src.seq, e.src.iter, e.src.delta)
    if memo is not None:
        if len(memo) > 256:
            memo.clear()
        memo[key] = out   # (callers only read it)
    return out


def record_intact(data: bytes, r: int, record_bytes: int, writer: tuple[int, int, int, int], wid: int) -> bool:
    file_id, seq, it, delta = writer
    base = r * record_bytes
    for off in range(base, base + record_bytes, CHUNK):
        info = decode_chunk(data[off:off + CHUNK])
        if info is None or (info.wid, info.file_id, info.seq, info.iter, info.offset) != (wid, file_id, seq, it, off - delta):
            return False
    return True


def intact_prefix(scan: ChunkScan, writers: dict[int, tuple[int, int, int, int]], record_bytes: int,
                  wid: int) -> int:
    """record_intact() for every record at once: how many records from the start are intact."""
    per = record_bytes // CHUNK
    n = 0
    while n in writers:
        n += 1
    n = min(n, scan.n // per)  # records past the data cannot be intact
    if n == 0 or record_bytes % CHUNK:
        return 0
    w = np.array([writers[r] for r in range(n)], dtype=np.int64).reshape(n, 4)
    chunk_off = np.arange(n * per, dtype=np.int64) * CHUNK
    h = scan.heads[:n * per]
    ok = scan.valid[:n * per] & (h["wid"] == wid)
    for col, name in enumerate(("file_id", "seq", "iter")):
        ok &= h[name].astype(np.int64) == np.repeat(w[:, col], per)
    ok &= h["offset"].astype(np.int64) == chunk_off - np.repeat(w[:, 3], per)
    bad = np.flatnonzero(~ok.reshape(n, per).all(axis=1))
    return int(bad[0]) if len(bad) else n


def last_record_with_data(data: bytes, scan: ChunkScan | None, record_bytes: int) -> int:
    """Index of the last record slot holding any non-zero byte, -1 if none."""
    n_slots = -(-len(data) // record_bytes)
    if scan is None or record_bytes % CHUNK:
        return max((r for r in range(n_slots) if any(data[r * record_bytes:(r + 1) * record_bytes])), default=-1)
    slot = np.flatnonzero(~scan.zero) * CHUNK // record_bytes
    tail = -1
    if len(data) > scan.n * CHUNK and any(data[scan.n * CHUNK:]):
        tail = scan.n * CHUNK // record_bytes
    return max(int(slot[-1]) if len(slot) else -1, tail)


Memo = dict[tuple[Any, ...], tuple[dict[str, Any], list[Finding]]]


def check_records(inv: RecordsInvariant, h: History, wid: int, mnt: str, n_done: int, allowed: set[int],
                  crash_point: int, scan: Callable[[str, bytes], ChunkScan] | None = None,
                  read: Callable[[str], tuple[bytes, int]] | None = None, memo: Memo | None = None,
                  key: Callable[[str], Hashable] | None = None,
                  written: WrittenMemo | None = None) -> tuple[list[dict[str, Any]], list[Finding]]:
    """Loss-window rows (one per recording file) and design findings at one crash
    point. N_DONE: ops < n_done had returned; ALLOWED: those and the ones in flight.
    SCAN (path, bytes) -> ChunkScan: check all chunks at once instead of one by one.
    READ (path) -> (bytes, token): how files are read (equal tokens, equal bytes).
    MEMO with KEY (path -> what the result depends on besides the bytes): results of
    earlier crash points with the same bytes and the same key are reused. WRITTEN: what
    the history says was written, by crash point (written_records)."""
    rows, findings = [], []
    for path in inv.paths:
        full = os.path.join(mnt, path)
        token: int | None = None
        if not os.path.isfile(full):
            data = b""
        elif read is not None:
            data, token = read(path)
        else:
            with open(full, "rb") as f:
                data = f.read()
        mkey = (path, token, key(path)) if memo is not None and key is not None and token is not None else None
        hit = memo.get(mkey) if mkey is not None else None  # type: ignore[union-attr]
        if hit is None:
            hit = _check_record_file(inv, h, wid, path, data, n_done, allowed, scan, written)
            if mkey is not None:
                if len(memo) > 4096:  # type: ignore[arg-type]
                    memo.clear()  # type: ignore[union-attr]
                memo[mkey] = hit  # type: ignore[index]
        row, found = hit
        rows.append(dict(row, crash_point=crash_point))
        for f in found:
            f = copy.deepcopy(f)
            f.crash_point = crash_point
            findings.append(f)
    return rows, findings


def _check_record_file(inv: RecordsInvariant, h: History, wid: int, path: str, data: bytes, n_done: int,
                       allowed: set[int], scan: Callable[[str, bytes], ChunkScan] | None,
                       written_memo: WrittenMemo | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """check_records for one file, its row and findings without the crash point."""
    crash_point = None
    findings: list[Finding] = []
    written = written_records(h, path, Allowed(n_done, frozenset()), inv.record_bytes, n_done, written_memo)
    writers = written_records(h, path, allowed, inv.record_bytes, last_allowed(allowed) + 1, written_memo)
    chunks = scan(path, data) if scan is not None else None
    last_data = last_record_with_data(data, chunks, inv.record_bytes)
    recovered = 0
    if chunks is not None and inv.record_bytes % CHUNK == 0:
        recovered = intact_prefix(chunks, writers, inv.record_bytes, wid)
    else:
        while recovered in writers and record_intact(data, recovered, inv.record_bytes, writers[recovered], wid):
            recovered += 1
    torn_tail = last_data == recovered
    if last_data > recovered:
        findings.append(Finding("design", f"{path}: record {recovered} is torn or foreign inside the surviving "
                                f"prefix ({last_data + 1} records hold data, {recovered} intact before it)",
                                crash_point=crash_point,
                                evidence={"path": path, "invariant": "records-prefix", "record": recovered,
                                          "expected": "whole records, then nothing",
                                          "found": f"record {recovered} not intact, data up to record {last_data}"}))
    loss = max(len(written) - recovered, 0)
    row = {"crash_point": crash_point, "path": path, "written": len(written), "recovered": recovered,
           "loss_records": loss, "loss_ms": loss * inv.period_us / 1000, "torn_tail": torn_tail}
    over = [(what, lim, row[k]) for what, lim, k in (("records", inv.max_loss_records, "loss_records"),
                                                      ("ms", inv.max_loss_ms, "loss_ms"))
            if lim is not None and row[k] > lim]
    for what, lim, got in over:
        findings.append(Finding("design", f"{path}: loss window {got} {what} exceeds the declared maximum {lim}",
                                crash_point=crash_point,
                                evidence={"path": path, "invariant": f"max_loss_{what}", "expected": f"<= {lim}",
                                          "found": str(got)}))
    return row, findings


def summarize_loss(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if not rows:
        return {}
    losses = sorted(r["loss_records"] for r in rows)
    ms = sorted(r["loss_ms"] for r in rows)
    return {"crash_points": len({r["crash_point"] for r in rows}), "max_loss_records": losses[-1],
            "max_loss_ms": ms[-1], "median_loss_records": losses[len(losses) // 2],
            "torn_tails": sum(r["torn_tail"] for r in rows), "rows": rows}


# Ops after (and just before) whose completion a crash matters most to a design:
# the durability calls, the range flushes and the boundaries of a file's life.
DESIGN_OPS = frozenset({"fsync", "fdatasync", "sync", "syncfs", "sync_file_range", "ftruncate", "truncate",
                        "rename", "open", "creat", "close"})


def design_points(h: History, points: list[int], paths: tuple[str, ...] = ()) -> set[int]:
    """The crash points a crash-point budget always keeps: for each op in DESIGN_OPS,
    the point at its completion mark and the last point before it (the ops
    before it done, it in flight). With PATHS (a records invariant's files),
    only ops on those files count, and sync/syncfs."""
    out: set[int] = set()
    fd_path: dict[tuple[int, Any], str] = {}
    for ex in h.execs:
        if ex.kind in ("open", "creat") and ex.ok:
            fd_path[(ex.rec.thread, ex.f("fd"))] = ex.f("path")
        if ex.kind not in DESIGN_OPS or ex.mark is None:
            continue
        path = ex.f("path") or ex.f("to") or fd_path.get((ex.rec.thread, ex.f("fd")))
        if paths and ex.kind not in ("sync", "syncfs") and path not in paths:
            continue
        k = bisect.bisect_right(points, ex.mark)
        out |= {points[j] for j in (k - 1, k - 2) if 0 <= j < len(points)}
    return out
