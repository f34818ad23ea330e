"""The crash-point budget (--max-states) and the loss window from the log at
every crash point, checked against the states that were mounted."""

from __future__ import annotations

import json

from conftest import WORKLOADS, PcEnv, needs_root_stack
from replay.crashpoints import budget_points
import pytest


def test_budget_keeps_must_points_and_spreads_the_rest() -> None:
    points = list(range(100, 1100))
    got = budget_points(points, {150, 151, 900}, 20)
    assert {150, 151, 900, 1099} <= set(got) and len(got) == 20 and got == sorted(got)
    gaps = [b - a for a, b in zip(got, got[1:]) if a not in (150, 151, 900) and b not in (150, 151, 900)]
    assert max(gaps) < 2 * len(points) / 16  # evenly: no long stretch left out
    assert budget_points(points, {3}, 0) == points and budget_points(points[:5], set(), 10) == points[:5]
    # More must-points than the budget: all of them (the report says how many).
    assert len(budget_points(points, set(range(100, 200)), 10)) == 101


@pytest.mark.e2e
@needs_root_stack
def test_budget_report_and_loss_window_from_the_log(pc: PcEnv) -> None:
    out = pc.tmp / "out"
    p = pc.run("run", str(WORKLOADS / "mini_recorder.json"), "--fs", "ext4", "--max-states", "12",
               "--out", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads((out / "report.json").read_text())
    b = r["budget"]
    assert b["crash_points_checked"] == r["crash_points"] < b["crash_points_all"]
    assert b["fraction_checked"] == round(b["crash_points_checked"] / b["crash_points_all"], 6)
    assert b["design_points"] > 0
    d = r["design"]["records"]
    log = d["from_log"]
    # The bounds exist at every crash point, mounted or not ...
    assert log["crash_points"] == b["crash_points_all"] and len(log["rows"]) == b["crash_points_all"]
    # ... and every mounted state's exact count lies within them.
    assert log["mounted_compared"] == len(d["rows"]) > 0 and log["mounted_outside_count"] == 0
    assert d["max_loss_records"] <= log["max_loss_records_upper"]
    last = log["rows"][-1]
    assert last["written"] == last["on_device"] == last["guaranteed"] == 48
