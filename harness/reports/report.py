"""report.json and the one-screen summary of a run."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

from foundation.jsondoc import write_json

SUMMARY_FINDINGS = 8


def latency_clock(extra: dict[str, Any]) -> str:
    """Whose clock a run's latencies are on (report.json `latency_clock`): `host` (fuse, dm: the
    kernel under test on this machine's hardware), `emulated` (a vm guest under QEMU's TCG:
    its times are the emulator's, they say nothing of any hardware) or `virtualised` (KVM)."""
    vm = extra.get("vm")
    if vm is None:
        return "host"
    return "virtualised" if vm.get("accel") == "kvm" else "emulated"


def budget_line(b: dict[str, Any]) -> str:
    """One plain sentence on a crash-point budget (report.json `budget`): which, and what it checked."""
    rule = (f"the default, --max-states {b['max_states']}" if b.get("default") else f"--max-states {b['max_states']}")
    if not b.get("applied", True):
        return f"crash-point budget ({rule}): every one of {b['crash_points_all']} crash points checked"
    return (f"crash-point budget ({rule}): {b['crash_points_checked']} of {b['crash_points_all']} crash points checked "
            f"(fraction {b['fraction_checked']:.4f}; all {b['design_points']} design points plus an even spread; "
            f"--max-states all checks every one)")


# Loss-window rows (one per crash point and recording file) beyond this many go to a
# JSON-lines file next to report.json: at --scale 1.0 the recorder scenario has about a
# million, which made report.json 295 MB, too big to attach to a bug report.
ROWS_INLINE_MAX = 20000


def _rows_aside(out_dir: str, report: dict[str, Any]) -> dict[str, Any]:
    """REPORT as written: a long `rows` list of `design.records` or of its `from_log`
    replaced by its file's name and count (`rows_file`, `rows_count`); REPORT itself
    (sections copied, not changed) keeps its rows."""
    records = report.get("design", {}).get("records")
    if not isinstance(records, dict):
        return report
    records = dict(records)
    doc = {**report, "design": {**report["design"], "records": records}}
    if isinstance(records.get("from_log"), dict):
        records["from_log"] = dict(records["from_log"])
    for section, name in ((records, "loss-rows.jsonl"), (records.get("from_log"), "loss-rows-from-log.jsonl")):
        rows = section.get("rows") if isinstance(section, dict) else None
        if not isinstance(rows, list) or len(rows) <= ROWS_INLINE_MAX:
            continue
        with open(os.path.join(out_dir, name), "w") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in rows)
        del section["rows"]
        section["rows_file"], section["rows_count"] = name, len(rows)
    return doc


def write_report(out_dir: str, report: dict[str, Any]) -> str:
    return write_json(os.path.join(out_dir, "report.json"), _rows_aside(out_dir, report))


def summary(report: dict[str, Any], report_path: str | None) -> str:
    findings = report["findings"]
    lines = [
        f"powercut {report['workload'].get('name', '')} on {report['fs']} "
        f"(mkfs: {report['mkfs_opts'] or 'defaults'}, mount: {report['mount_opts'] or 'defaults'}, "
        f"backend {report['backend']}, kernel {report['kernel']}, semantics {report.get('semantics', 'posix')})",
        f"  log entries: {report['log_entries']}   crash points: {report['crash_points']}   "
        f"crash states checked: {report['crash_states_checked']}"
        + (f" (+{report['crash_states_duplicate']} duplicates skipped)" if report.get("crash_states_duplicate") else ""),
    ]
    if report.get("budget", {}).get("applied"):
        lines.append("  " + budget_line(report["budget"]))
    checks = report.get("recovery_checks") or {}
    if set(checks) - {"rw"}:
        lines.append("  recoveries checked: " + ", ".join(f"{m} {n}" for m, n in checks.items()))
    rc = report.get("recovery_crash")
    if rc:
        lines.append(f"  crashes during recovery: {rc['recoveries_recorded']} recoveries recorded, "
                     f"{rc['states_checked']} recovery crash states checked")
        if rc.get("recorded_mounts_failed"):
            lines.append(f"  warning: {rc['recorded_mounts_failed']} recovery mounts failed while recorded "
                         "(their recoveries were not crashed in)")
    cov = report.get("coverage")
    if cov and cov.get("available"):
        lines.append(f"  kernel coverage ({', '.join(cov['modules'])}): workload {cov['workload']['functions']} functions, "
                     f"recovery {cov['recovery']['functions']}, {cov['total_functions']} in all")
    if report["workload"].get("exit_code"):
        lines.append(f"  warning: workload exited with {report['workload']['exit_code']}")
    for r in report.get("mount_retries", [])[:SUMMARY_FINDINGS]:
        lines.append(f"  warning: state {r['state_id']} mounted only at the second try (first: {r['error'][:120]})")
    for w in report.get("device_waits", [])[:SUMMARY_FINDINGS]:
        lines.append(f"  warning: state {w['state_id']}: {w['device']} was {w['errno']} at the recovery mount, "
                     f"free after {w['waited_s']}s ({w['held_by'][:120]})")
    if report.get("stopped_at_first_failure"):
        lines.append("  stopped at the first finding (--first-failure): later crash states not checked")
    known = report.get("expected_damage")
    if known and known["count"]:
        lines.append(f"  expected damage ({known['configuration']}, no metadata consistency after a crash): "
                     f"{known['count']} in {known['crash_states']} crash states, not findings "
                     "(report: expected_damage)")
    if not findings:
        lines.append("  findings: none")
    else:
        by_kind = Counter(f["kind"] for f in findings)
        lines.append("  findings: " + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())))
        for f in findings[:SUMMARY_FINDINGS]:
            where = ""
            if f.get("crash_point") is not None:
                where = f" at entry {f['crash_point']}" + (f" (after mark {f['crash_mark']!r})" if f.get("crash_mark") else "")
                if f.get("state_id"):  # rebuild it with `powercut crash-image --state ID`
                    where = f" in state {f['state_id']}," + where
            how = f" ({f['recovery']} recovery)" if f.get("recovery") else ""
            lines.append(f"    [{f['kind']}]{where}{how}: {f['detail'].splitlines()[0][:160]}")
        if len(findings) > SUMMARY_FINDINGS:
            lines.append(f"    ... {len(findings) - SUMMARY_FINDINGS} more in the report")
    if report_path:
        lines.append(f"  report: {report_path}")
    if report.get("markdown_path"):
        lines.append(f"  markdown: {report['markdown_path']}")
    return "\n".join(lines)
