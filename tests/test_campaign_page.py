"""report.md of a campaign from its report.json alone (no finding directories, as a joined
campaign's merged report may be): a `coverage` section of any shape is rendered figure by
figure, a report without one has no such section."""

from __future__ import annotations

from pathlib import Path

from harness.reports.campaign_page import render


def _report(**extra: object) -> dict:
    return {"engine": "mixed", "fs": "btrfs", "run": {"fs": "btrfs", "backend": "fuse", "reorder": "drop-one"},
            "spec": {"jobs": 1, "seed": 1}, "started": 0.0, "stop_reason": "duration", "elapsed_s": 60.0,
            "workloads": 2, "workloads_per_minute": 2.0, "crash_states_checked": 10, "crash_states_per_second": 0.2,
            "shrink_runs": 0, "findings_by_kind": {}, "saved_findings": [], **extra}


def test_coverage_figures_are_rendered_whatever_their_fields(tmp_path: Path) -> None:
    cov = {"functions": {"workload": 812, "recovery": 95}, "new_per_minute": [3, 1, 0], "source": "ftrace"}
    md, triage = render(_report(coverage=cov), str(tmp_path), [{"t": 1.0, "states": 5}, {"t": 30.0, "states": 5}],
                        str(tmp_path / "findings"))
    section = md.split("## Coverage", 1)[1]
    for figure, value in (("functions.workload", "812"), ("functions.recovery", "95"), ("new_per_minute", "[3, 1, 0]"),
                          ("source", "ftrace")):
        assert f"| {figure} | {value} |" in section, section
    assert triage == [] and (tmp_path / "plots" / "progress.png").stat().st_size > 0
    md, _ = render(_report(), str(tmp_path), [], str(tmp_path / "findings"))
    assert "## Coverage" not in md and "No workload finished: no figure" in md
