"""What an export needs from a saved finding directory (fuzz/store.py layout).

The ops that had completed at the finding's crash point (the mark before
it), the set-up (fs, mkfs and mount options, device size), the kernels the
finding was seen on, and the evidence (fsck output, expected vs found).
Reads JSON only: an export never runs the file system.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from checkers.documented_bugs import triage_finding
from foundation.errors import UsageError
from replay.logformat import LogReader
from workloads.format import parse_workload
from workloads.marks import parse_mark

RUN_DIR = "run"


@dataclass
class ExportInput:
    directory: str
    name: str                       # e.g. "011-fsck"
    kind: str
    detail: str
    state_id: str
    in_order: bool                  # the crash state is a prefix of the log (no reordering)
    fs: str
    mkfs_opts: str
    mount_opts: str
    device_bytes: int
    ops: list[dict[str, Any]]       # the ops completed at the crash point, in order
    seqs: list[int]                 # each op's index in the workload (its marks' seq)
    ops_after: int                  # ops of the workload after them (not run: the crash comes first)
    threads: int = 1                # the workload's threads (their ops are serialised in `ops`)
    in_flight: str = ""             # the op that was running at the crash point and is run to its end here
    kernels: list[str] = field(default_factory=list)      # seen on
    clean_on: list[str] = field(default_factory=list)     # run there without this finding (powercut bisect)
    fsck_output: str = ""
    expected: str = ""
    found: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    triage: str = ""                # a documented bug by name, or new (checkers/documented_bugs.py)


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise UsageError(f"{os.path.dirname(path)}: not a saved finding (no {os.path.basename(path)})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not valid JSON ({e.msg})") from None


def load(directory: str) -> ExportInput:
    info = _read_json(os.path.join(directory, "finding.json"))
    doc = _read_json(os.path.join(directory, "workload.json"))
    report = _read_json(os.path.join(directory, RUN_DIR, "report.json"))
    parse_workload(doc)  # a malformed workload is a usage error, one line
    log = os.path.join(directory, RUN_DIR, report["log"])
    if any(op["op"] == "repeat" for t in doc["threads"] for op in t["ops"]):
        raise UsageError(f"{directory}: export does not handle repeat ops yet")
    ops, order = _serialised(doc, log)
    done = _completed(order, info.get("crash_mark"))
    if info["kind"] == "kernel" and info.get("evidence", {}).get("phase") == "workload":
        done = len(order)  # the kernel complained while running the ops: all of them run, then the power cut
    # A crash point after some of the next op's writes: that op had begun to
    # reach the disk. A power cut between ops cannot be in the middle of it,
    # so it runs to its end here (the nearest state after it).
    in_flight = ""
    if done < len(order) and _writes_after_mark(log, info.get("crash_point"), info.get("crash_mark")):
        in_flight = ops[order[done]]["op"]
        done += 1
    # Ops that leave nothing on disk and that the exports have no form for
    kept = [i for i in order[:done] if ops[i]["op"] not in ("sleep", "fiemap", "statx", "barrier")]
    cfg = info.get("config", {})
    kernels = [k for k in [report.get("kernel"), *info.get("seen_on", [])] if k]
    fsck = ""
    if os.path.exists(os.path.join(directory, "fsck.txt")):
        with open(os.path.join(directory, "fsck.txt")) as f:  # the image's scratch path says nothing upstream
            fsck = re.sub(r"/\S*/([^/\s]+\.img)\b", r"\1", f.read().strip())
    state_id = info.get("state_id") or ""
    return ExportInput(
        directory=os.path.abspath(directory), name=os.path.basename(os.path.abspath(directory)),
        kind=info["kind"], detail=info.get("detail", ""), state_id=state_id,
        in_order=state_id.startswith("p") and "-" not in state_id,
        fs=cfg.get("fs") or report["fs"], mkfs_opts=cfg.get("mkfs_opts", report.get("mkfs_opts", "")) or "",
        mount_opts=report.get("mount_opts", "") or "", device_bytes=int(report["device_bytes"]),
        ops=[ops[i] for i in kept], seqs=kept, ops_after=len(order) - done,
        threads=len(doc["threads"]),
        in_flight=in_flight,
        kernels=sorted(set(kernels)), fsck_output=fsck, expected=str(info.get("expected") or ""),
        found=str(info.get("found") or ""), evidence=info.get("evidence", {}),
        triage=triage_finding(info, doc, str(report.get("kernel") or "")).line())


def _serialised(doc: dict[str, Any], log: str) -> tuple[list[dict[str, Any]], list[int]]:
    """Every op by its seq (threads in order: no repeats here) and the order they ran in.

    One thread: its program order. Several: the order their completion marks
    reached the log, the one order the recording saw (ops of two threads that
    overlapped in time ran concurrently; the export runs them one after the
    other, in that order). Each thread's fd names get the thread's name in
    front: two threads may both call an fd `f`."""
    threads = doc["threads"]
    if len(threads) == 1:
        ops = list(threads[0]["ops"])
        return ops, list(range(len(ops)))
    ops = [{**op, "fd": f"{t.get('name') or n}.{op['fd']}"} if "fd" in op else dict(op)
           for n, t in enumerate(threads) for op in t["ops"]]
    order: list[int] = []
    if os.path.exists(log):
        with LogReader(log) as reader:
            for e in reader.entries():
                m = parse_mark(e.mark) if e.is_mark and e.mark else None
                if m is not None and m.event == "op" and m.seq is not None and m.seq < len(ops):
                    order.append(m.seq)
    return ops, order + [i for i in range(len(ops)) if i not in order]  # never marked: last


def _completed(order: list[int], crash_mark: str | None) -> int:
    """How many ops of ORDER had returned at a crash point whose last mark is CRASH_MARK
    (an op's mark: those up to it in ORDER; one thread's ORDER is its program order)."""
    mark = parse_mark(crash_mark) if crash_mark else None
    if mark is not None and mark.event == "op" and mark.seq in order:
        return order.index(mark.seq) + 1
    return completed_ops(crash_mark, len(order))


def completed_ops(crash_mark: str | None, n_ops: int) -> int:
    """How many ops had returned at a crash point whose last mark is CRASH_MARK."""
    if not crash_mark:
        return 0
    mark = parse_mark(crash_mark)
    if mark is None:  # pc:mkfs-done, pc:mounted: before the first op; pc:workload-end: all
        return n_ops if "end" in crash_mark else 0
    if mark.event == "end":
        return n_ops
    if mark.event == "start" or mark.seq is None:
        return 0
    return min(mark.seq + 1, n_ops)


def _writes_after_mark(log: str, crash_point: int | None, crash_mark: str | None) -> bool:
    """Whether the log has writes (or flushes) after the mark CRASH_MARK and up to CRASH_POINT."""
    if crash_point is None or not crash_mark or not os.path.exists(log):
        return False
    after = False
    with LogReader(log) as reader:
        for e in reader.entries():
            if e.index > crash_point:
                break
            if e.is_mark:
                after = e.mark == crash_mark or (e.mark or "").rstrip("\n") == crash_mark.rstrip("\n")
            elif after and (e.nr_sectors or e.is_flush):
                return True
    return False


def add_bisect(x: ExportInput, path: str) -> None:
    """The kernels a `powercut bisect` report (bisect.json) tested: with X's kind, or without."""
    report = _read_json(path)
    for t in report.get("tested", []):
        verdict = str(t.get("verdict", ""))
        if verdict.startswith("error"):
            continue
        target = x.kernels if x.kind in verdict.replace(",", " ").split() else x.clean_on
        if t["kernel"] not in target:
            target.append(t["kernel"])
