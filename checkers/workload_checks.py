"""The checks a JSON workload adds to a run: latency, live semantics and the
content oracle, all from the executor's records and the log's marks."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Any

from checkers import btrfs_commits, latency
from checkers.design import summarize_loss
from checkers.findings import Finding
from checkers.fsrules import Semantics
from checkers.history import build_history
from checkers.logloss import loss_from_log, summarize_from_log
from checkers.oracle import ContentOracle
from checkers.untorn import summarize_torn
from replay.logformat import LogReader
from workloads.format import Workload
from workloads.plan import Plan
from workloads.results import Results, read_records


@dataclass
class WorkloadChecks:
    report: dict[str, Any] = field(default_factory=dict)   # sections for report.json
    findings: list[Finding] = field(default_factory=list)  # latency and semantics findings
    oracle: ContentOracle | None = None                    # content checks per crash image


def log_marks(reader: LogReader) -> list[tuple[int, str]]:
    return [(e.index, e.mark) for e in reader.entries() if e.is_mark and e.mark is not None]


def prepare(workload: Workload, plan: Plan, records_path: str, reader: LogReader,
            semantics: Semantics) -> WorkloadChecks:
    results = read_records(records_path, plan)
    checks = WorkloadChecks()
    checks.report["latency"] = latency.summarize(results, workload)
    checks.findings += [Finding("latency", f["detail"], evidence={k: v for k, v in f.items() if k not in ("kind", "detail")})
                        for f in latency.findings(checks.report["latency"], workload)]
    history = build_history(plan, results, log_marks(reader), semantics.reflink(), semantics.exchange())
    if any(semantics.holds(r) for r in (btrfs_commits.RULE, btrfs_commits.RELOG, "btrfs-log-dirs")):
        txns = btrfs_commits.Transactions(history, btrfs_commits.supers(reader), semantics.mount_opts)
        if semantics.holds("btrfs-log-dirs"):
            btrfs_commits.note_transactions(txns)
        if semantics.holds(btrfs_commits.RELOG):
            btrfs_commits.add_relog_persists(txns)
        if semantics.holds(btrfs_commits.RULE):
            btrfs_commits.add_commit_persists(txns)
    for d in history.disagreements:
        evidence = {"op": d.ex.describe(), "op_mark": d.ex.mark, "expected": d.expected}
        if d.ex.rec.ret < 0:  # what the kernel returned (fold_error_state reads it)
            evidence["errno"] = errno.errorcode.get(d.ex.rec.errno, str(d.ex.rec.errno))
        checks.findings.append(Finding("semantics", f"{d.ex.describe()}: {d.expected}", evidence=evidence))
    statx = statx_limits(plan, results)
    if statx:
        checks.report["statx"] = statx
    checks.oracle = ContentOracle(history, plan.wid, semantics.fs, dict(workload.invariants or {}), semantics)
    checks.report["oracle"] = {"semantics": semantics.tier, "ops_modelled": len(history.execs), "lost_track": history.lost,
                               "uncertain_paths": sorted(history.uncertain)}
    return checks


def statx_limits(plan: Plan, results: Results) -> list[dict[str, Any]]:
    """report.json `statx`: what each statx op read (the untorn-write and direct I/O limits in force)."""
    ops = plan.by_seq()
    out = []
    for r in results.records:
        if r.kind == "statx":
            row: dict[str, Any] = {"op": r.seq, "iter": r.iter, "path": ops[r.seq][1].fields["path"], "errno": r.errno}
            if r.statx is not None:
                row.update(r.statx.to_json(), atomic_supported=r.statx.atomic_supported)
            out.append(row)
    return out


def finish(checks: WorkloadChecks, reader: LogReader | None = None, points: list[int] | None = None) -> None:
    """After the crash walk: what the oracle measured across crash points; with READER
    and POINTS (every crash point, checked or not), the loss window from the log too."""
    o = checks.oracle
    if o is not None and o.states:
        checks.report["oracle"]["states_inspected"] = o.states
        checks.report["oracle"]["ms_per_state"] = round(1000 * o.seconds / o.states, 3)
        f = o.files  # what was read from the images (checkers/filememo.py)
        checks.report["oracle"]["files"] = {"reused": f.reused, "patched": f.patched, "read": f.read,
                                            "bytes_read_per_state": round(f.bytes_read / o.states)}
    if checks.oracle is not None and checks.oracle.records is not None:
        o = checks.oracle
        rows = sorted(o.loss_rows, key=lambda r: r["crash_point"])
        checks.report["design"] = {"records": summarize_loss(rows)}
        if reader is not None and points and o.records is not None:
            marks = [ex.mark if ex.mark is not None else 1 << 62 for ex in o.h.execs]
            log_rows = loss_from_log(o.records, o.h, o.wid, reader, points, marks)
            checks.report["design"]["records"]["from_log"] = {
                **summarize_from_log(log_rows, rows, o.records.period_us), "rows": log_rows}
    if checks.oracle is not None and checks.oracle.torn_rows:
        checks.report["torn_writes"] = summarize_torn(checks.oracle.torn_rows)


def records_path(out_dir: str, info: dict[str, Any]) -> str:
    return os.path.join(out_dir, info["records"])
