"""Long loss-window row lists go to JSON-lines files next to report.json (a scale-1.0
recorder run has about a million of them); short ones stay inline."""

from __future__ import annotations

import json
from pathlib import Path

from harness.reports import report as rep


def _report(n: int) -> dict:
    rows = [{"crash_point": i, "path": "a.rec", "written": i, "recovered": i} for i in range(n)]
    log_rows = [{"crash_point": i, "path": "a.rec", "loss_min": 0, "loss_max": 1} for i in range(n)]
    return {"fs": "ext4", "design": {"records": {"max_loss_records": 1, "rows": rows,
                                                 "from_log": {"crash_points": n, "rows": log_rows}}}}


def test_long_rows_are_written_aside_and_the_report_in_memory_keeps_them(tmp_path: Path) -> None:
    n = rep.ROWS_INLINE_MAX + 1
    report = _report(n)
    rep.write_report(str(tmp_path), report)
    saved = json.loads((tmp_path / "report.json").read_text())["design"]["records"]
    assert "rows" not in saved and saved["rows_count"] == n and saved["max_loss_records"] == 1
    assert "rows" not in saved["from_log"] and saved["from_log"]["rows_count"] == n
    for section, name in ((saved, "loss-rows.jsonl"), (saved["from_log"], "loss-rows-from-log.jsonl")):
        assert section["rows_file"] == name
    aside = [json.loads(line) for line in (tmp_path / "loss-rows.jsonl").read_text().splitlines()]
    assert aside == report["design"]["records"]["rows"]
    aside = [json.loads(line) for line in (tmp_path / "loss-rows-from-log.jsonl").read_text().splitlines()]
    assert aside == report["design"]["records"]["from_log"]["rows"]
    assert len(report["design"]["records"]["rows"]) == n  # the caller's report is untouched


def test_short_rows_stay_in_the_report(tmp_path: Path) -> None:
    report = _report(3)
    rep.write_report(str(tmp_path), report)
    assert json.loads((tmp_path / "report.json").read_text()) == report
    assert not list(tmp_path.glob("*.jsonl"))
