"""What a campaign leaves when it stops, whatever stopped it (duration, budget, Ctrl-C,
SIGTERM): report.json with the documented bugs it hit and each saved finding's triage,
and report.md beside it (harness/reports/campaign_page.py)."""

from __future__ import annotations

import os
from typing import Any

from foundation.jsondoc import write_json
from fuzz.known import hits
from harness.reports.campaign_page import write_page
from harness.reports.report import latency_clock


def complete(report: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """REPORT with the fields the journal ENTRIES give beyond its totals."""
    report["known_bug_hits"] = hits(entries)
    report["latency_clock"] = latency_clock(report)  # its "vm" section says whether a guest's clock measured
    return report


def write(out_dir: str, report: dict[str, Any], entries: list[dict[str, Any]], title: str = "") -> tuple[str, str]:
    """OUT_DIR/report.json and OUT_DIR/report.md; their paths. Each saved finding gets its triage
    (a documented bug by name, or new) in report.json, as report.md shows it."""
    complete(report, entries)
    path = write_json(os.path.join(out_dir, "report.json"), report)  # first: a failure below must not cost it
    md, triage = write_page(report, out_dir, entries, os.path.join(out_dir, "findings"), title)
    for s, line in zip(report["saved_findings"], triage):
        s["triage"] = line
    return write_json(path, report), md
