"""The recorder's loss window at every crash point, from the log alone (no mount).

A crash-point budget mounts only some crash states; the loss window is
wanted at all of them. Without mounting, the log still bounds it:

- upper bound on what a crash at point P can recover (`on_device`): every
  512-byte chunk a write carries names its writer and file offset
  (workloads/pattern.py), so scanning the log's write entries in order gives,
  for each record, the entry at which all of its chunks had reached the
  device (in the file's data blocks, or in a journal). A record not yet there
  cannot come back intact, so records recovered from the start <= the
  number of leading records on the device at P;
- lower bound (`guaranteed`): the leading records whose write had returned
  before the last completed fsync/fdatasync/sync that covers the file; a
  healthy file system brings them back.

So at every crash point, loss_records lies in [written - on_device,
written - guaranteed]. Where a state was mounted, the exact count is checked
against these bounds (`report.json` design.records.from_log.mounted_*).
What the log cannot tell is whether the metadata that makes data reachable
(the file size, an unwritten-extent conversion) was committed: that is why
the upper bound can be loose before the final fsync.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from checkers.design import RecordsInvariant
from checkers.history import History
from replay.logformat import LogReader
from workloads.pattern import CHUNK, scan_chunks


def _records(h: History, path: str, record_bytes: int) -> tuple[dict[int, int], dict[tuple[int, int, int, int], tuple[int, int]]]:
    """For PATH's last inode: record -> position of the first write that wrote it whole,
    and chunk key (file_id, seq, iter, pattern offset) -> (record, chunk in record)."""
    ino_id = next((ns[path] for ns in reversed(h.ns) if path in ns), None)
    first_pos: dict[int, int] = {}
    keys: dict[tuple[int, int, int, int], tuple[int, int]] = {}
    if ino_id is None:
        return first_pos, keys
    for e in h.inodes[ino_id].events:
        if e.kind != "data":
            continue
        for r in range(-(-e.start // record_bytes), e.end // record_bytes):
            first_pos.setdefault(r, e.pos)
            for c in range(record_bytes // CHUNK):
                off = r * record_bytes + c * CHUNK
                keys[(e.src.file_id, e.src.seq, e.src.iter, off - e.src.delta)] = (r, c)
    return first_pos, keys


def loss_from_log(inv: RecordsInvariant, h: History, wid: int, reader: LogReader, points: list[int],
                  marks: list[int]) -> list[dict[str, Any]]:
    """One row per crash point and recording file: written, on_device, guaranteed and
    the loss bounds. MARKS: the log index of each op's completion mark, by position."""
    per = inv.record_bytes // CHUNK
    files = []
    for path in inv.paths:
        first_pos, keys = _records(h, path, inv.record_bytes)
        files.append((path, first_pos, keys))
    index = {k: (i, rc) for i, (_, _, keys) in enumerate(files) for k, rc in keys.items()}
    seen: list[dict[int, set[int]]] = [{} for _ in files]
    complete: list[dict[int, int]] = [{} for _ in files]   # record -> log entry where it was whole on the device
    if index and inv.record_bytes % CHUNK == 0:
        for e in reader.entries():
            if not e.is_write or e.nr_sectors * reader.sectorsize < CHUNK:
                continue
            scan = scan_chunks(reader.read_data(e))
            h_ = scan.heads
            for c in np.flatnonzero(scan.valid & (h_["wid"] == wid)).tolist():
                hit = index.get((int(h_["file_id"][c]), int(h_["seq"][c]), int(h_["iter"][c]), int(h_["offset"][c])))
                if hit is None:
                    continue
                i, (r, k) = hit
                got = seen[i].setdefault(r, set())
                got.add(k)
                if len(got) == per and r not in complete[i]:
                    complete[i][r] = e.index
    rows = []
    persists = sorted(((p.ex.pos, p.prefix, p.ino) for p in h.persists if p.range is None and not p.names_only), key=lambda t: t[0])
    for i, (path, first_pos, _) in enumerate(files):
        n = 0
        while n in first_pos:
            n += 1
        # running maxima: the leading k records are on the device / written once the k-th limit is passed
        on_dev = list(np.maximum.accumulate([complete[i].get(r, 1 << 62) for r in range(n)])) if n else []
        wrote = list(np.maximum.accumulate([first_pos[r] for r in range(n)])) if n else []
        written_pos = sorted(first_pos.values())
        ino_id = next((ns[path] for ns in reversed(h.ns) if path in ns), None)
        mine = [(pos, prefix) for pos, prefix, ino in persists if ino is None or ino == ino_id]
        mine_pos = [pos for pos, _ in mine]
        best = list(np.maximum.accumulate([prefix for _, prefix in mine])) if mine else []
        for p in points:
            n_done = bisect.bisect_right(marks, p)
            written = bisect.bisect_left(written_pos, n_done)
            k = bisect.bisect_left(mine_pos, n_done)   # persists completed (position < n_done)
            g_prefix = int(best[k - 1]) if k else 0
            on_device = bisect.bisect_right(on_dev, p)
            guaranteed = bisect.bisect_left(wrote, g_prefix)
            rows.append({"crash_point": p, "path": path, "written": written, "on_device": on_device,
                         "guaranteed": guaranteed, "loss_min": max(written - on_device, 0),
                         "loss_max": max(written - guaranteed, 0)})
    return rows


def summarize_from_log(rows: list[dict[str, Any]], mounted: list[dict[str, Any]], period_us: int) -> dict[str, Any]:
    """The bounds over every crash point, and how the mounted states' exact counts sit in them."""
    if not rows:
        return {}
    at = {(r["crash_point"], r["path"]): r for r in rows}
    outside, exact, compared = [], 0, 0
    for m in mounted:
        b = at.get((m["crash_point"], m["path"]))
        if b is None:
            continue
        compared += 1
        if not b["guaranteed"] <= m["recovered"] <= b["on_device"]:
            outside.append({**{k: b[k] for k in ("crash_point", "path", "guaranteed", "on_device")},
                            "recovered": m["recovered"], "state_id": m.get("state_id")})
        exact += m["recovered"] == b["on_device"]
    return {"crash_points": len({r["crash_point"] for r in rows}),
            "max_loss_records_lower": max(r["loss_min"] for r in rows),
            "max_loss_records_upper": max(r["loss_max"] for r in rows),
            "max_loss_ms_lower": max(r["loss_min"] for r in rows) * period_us / 1000,
            "max_loss_ms_upper": max(r["loss_max"] for r in rows) * period_us / 1000,
            "mounted_compared": compared, "mounted_outside_bounds": outside[:20],
            "mounted_outside_count": len(outside), "mounted_equal_upper": exact}
