"""The crash-point budget (--max-states) and the loss window from the log at
every crash point, checked against the states that were mounted."""

from __future__ import annotations

import json

from conftest import WORKLOADS, PcEnv, needs_root_stack
from replay.crashpoints import DEFAULT_BUDGET, Budget, budget_points, parse_budget
from foundation.errors import UsageError
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


def test_design_plus_budget_keeps_every_design_point_and_n_others() -> None:
    points = list(range(100, 1100))
    must = set(range(100, 1000, 10))  # 90 design points, more than most budgets
    got = Budget(25, design_plus=True).choose(points, must)
    assert must <= set(got) and 1099 in got and len(got) == 90 + 1 + 25
    # A run with fewer other points than N: every point (small runs are not cut).
    assert Budget(2000, design_plus=True).choose(points, must) == points
    assert parse_budget("design+500") == Budget(500, design_plus=True)
    assert parse_budget("all") is None and parse_budget(0) is None and parse_budget("12") == Budget(12)
    for bad in ("design+", "x", "-3", "design+-1"):
        with pytest.raises(UsageError):
            parse_budget(bad)


@pytest.mark.e2e
@needs_root_stack
def test_default_budget_cuts_a_scenario_and_says_so(pc: PcEnv) -> None:
    """The default's rule (design+N) with a small N on a scenario: every design point
    plus N others, in report.json, report.md and the progress output."""
    out = pc.tmp / "rec"
    p = pc.run("run", "scenario:recorder", "--fs", "ext4", "--scale", "0.01", "--jobs", "2",
               "--max-states", "design+20", "--out", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads((out / "report.json").read_text())
    b = r["budget"]
    assert b["applied"] and not b["default"] and b["max_states"] == "design+20"
    assert b["design_points"] > 0 and b["design_points"] < b["crash_points_checked"] == r["crash_points"]
    assert b["crash_points_checked"] <= b["design_points"] + 1 + 20 < b["crash_points_all"]
    assert 0 < b["fraction_checked"] < 1
    said = f"{b['crash_points_checked']} of {b['crash_points_all']} crash points checked"
    assert said in p.stderr and said in p.stdout and said in (out / "report.md").read_text()
    # The loss window is still computed from the log at every crash point.
    assert r["design"]["records"]["from_log"]["crash_points"] == b["crash_points_all"]


@pytest.mark.e2e
@needs_root_stack
def test_small_runs_check_every_point_by_default_and_all_asks_for_every_point(pc: PcEnv) -> None:
    reports = {}
    for name, flags in (("default", ()), ("all", ("--max-states", "all"))):
        out = pc.tmp / name
        p = pc.run("run", str(WORKLOADS / "mini_recorder.json"), "--fs", "ext4", *flags, "--out", str(out))
        assert p.returncode == 0, p.stderr
        reports[name] = json.loads((out / "report.json").read_text())
    d, a = reports["default"], reports["all"]
    assert d["budget"] == {**d["budget"], "default": True, "applied": False, "max_states": DEFAULT_BUDGET,
                           "crash_points_checked": d["crash_points"], "fraction_checked": 1.0}
    # (Two recordings may differ in flushes, so each run is compared with its own crash points.)
    assert d["crash_points"] == d["budget"]["crash_points_all"] == d["crash_points_all"]
    assert "budget" not in a and a["max_states"] == "all" and a["crash_points"] == a["crash_points_all"] > 0
    assert "every one of" in (pc.tmp / "default" / "report.md").read_text()


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
    assert b["design_points"] > 0 and 0 < b["fraction_checked"] < 1
    # by hand from the rule: 12 points, or every design point and the last if they are more
    assert b["crash_points_checked"] == max(12, b["design_points"] + 1), b
    d = r["design"]["records"]
    log = d["from_log"]
    # The bounds exist at every crash point, mounted or not ...
    assert log["crash_points"] == b["crash_points_all"] and len(log["rows"]) == b["crash_points_all"]
    # ... and every mounted state's exact count lies within them.
    assert log["mounted_compared"] == len(d["rows"]) > 0 and log["mounted_outside_count"] == 0
    assert d["max_loss_records"] <= log["max_loss_records_upper"]
    last = log["rows"][-1]
    assert last["written"] == last["on_device"] == last["guaranteed"] == 48
