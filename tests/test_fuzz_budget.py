"""`powercut fuzz --max-states`: a crash-point budget per workload, through the real stack.

design+N keeps every design point (where the durability promises apply) and
N others; a slow backend (vm) can spend its time there. Shown on the fuse
backend (same pipeline, seconds instead of minutes): the same seq-1 workload
checks fewer crash points under design+0 than with every point, the budget
is in each run's report, and a bad budget is one line, exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import PcEnv, needs_root_stack

pytestmark = [pytest.mark.e2e, needs_root_stack]

ONE = ["--fs", "ext4", "--engine", "exhaustive", "--seq", "1", "--max-workloads", "1", "--duration", "5m"]


def _states(pc: PcEnv, name: str, *args: str) -> int:
    out = pc.tmp / name
    pc.run("fuzz", "--out", str(out), *ONE, *args, check_rc=0, timeout=600)
    report = json.loads((out / "report.json").read_text())
    assert report["workloads"] == 1 and report["run"]["max_states"] == (args[1] if args else "all")
    return int(report["crash_states_checked"])


def test_design_budget_checks_fewer_states_of_the_same_workload(pc: PcEnv) -> None:
    every = _states(pc, "all")
    design = _states(pc, "design", "--max-states", "design+0")
    assert 0 < design < every


def test_bad_budget_is_one_line_exit_2(pc: PcEnv) -> None:
    p = pc.run("fuzz", "--out", str(Path(pc.tmp) / "bad"), *ONE, "--max-states", "design+x")
    assert p.returncode == 2 and "--max-states design+x" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
