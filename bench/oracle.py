"""Bench: what a crash state costs as the workload grows (the recorder scenario).

- oracle_scale_curve: the recorder scenario at several scales, each a whole
  run with a crash-point budget (--max-states): wall time per checked state
  of the crash walk (report.json crash_walk.ms_per_state: build, recover,
  inspect, fsck), the content oracle's own time per state (oracle.ms_per_state)
  and the bytes it read per state. Flat means the cost does not grow with the log.
- incremental_vs_full: at one scale, an oracle that reads and checks every
  file at every state (ContentOracle.incremental = False) reads the same
  recovered images right after the incremental one: the ratio of their
  times per state, and whether their verdicts agreed on every state.
- recorder_whole_runs: `powercut run scenario:recorder --scale S --max-states
  all` as a user types it (every crash point, report.md and figures), wall
  time from start to exit, next to what issue 16 measured for the same
  command before this work (ISSUE_16_BEFORE: a figure recorded then, not
  measured in this run; the per-state ratios above are same-run).
- bulk_vs_sector: at one scale, the sector-by-sector reference oracle reads
  the same recovered images right after the bulk one: the ratio of their
  times per state, and whether their verdicts agreed on every state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from checkers.history import build_history
from checkers.oracle import ContentOracle
from checkers.workload_checks import log_marks
from harness.pipeline.config import RunConfig
from harness.pipeline.run import run_checked
from replay.crashstates import CrashState
from replay.logformat import LogReader
from workloads.results import read_records
from workloads.runner import ExecutorWorkload, load_runner

SCALES = (0.01, 0.04, 0.16)
BUDGET = 60
WHOLE_RUN_SCALES = (0.01, 0.02, 0.04)
# Issue 16's table (2026-11-22, this machine, one run each): total seconds, crash states/s.
ISSUE_16_BEFORE = {"0.01": (36.0, 18.0), "0.02": (145.0, 7.3), "0.04": (319.0, 5.3)}


def _recorder(scale: float) -> ExecutorWorkload:
    runner = load_runner("scenario:recorder", scale)
    assert isinstance(runner, ExecutorWorkload)
    return runner


Floor = Callable[[str, int], dict[str, Any]]   # (log, device bytes) -> the bare mount+umount+fsck cost


def oracle_scale_curve(scratch: str, scales: tuple[float, ...] = SCALES, budget: int = BUDGET,
                       floor: Floor | None = None) -> dict[str, Any]:
    """FLOOR: also measure the bare kernel + fsck cost per state on each scale's own log
    (the file system grows with the scale), so the walk can be given over it."""
    out: dict[str, Any] = {}
    for scale in scales:
        t0 = time.perf_counter()
        res = run_checked(_recorder(scale), RunConfig.parse({"fs": "ext4", "quiet": True, "max_states": budget}),
                          os.path.join(scratch, f"recorder-{scale}"))
        r = res.report
        out[str(scale)] = {"states_checked": r["crash_states_checked"], "log_entries": r["log_entries"],
                           "run_seconds": round(time.perf_counter() - t0, 2),
                           "oracle_ms_per_state": r["oracle"].get("ms_per_state"),
                           "state_ms": r["crash_walk"]["ms_per_state"], "image_loads": r["crash_walk"]["image_loads"],
                           "oracle_files": r["oracle"].get("files"),
                           "fraction_checked": r.get("budget", {}).get("fraction_checked", 1.0)}
        if floor is not None:
            f = floor(os.path.join(scratch, f"recorder-{scale}", r["log"]), r["device_bytes"])
            out[str(scale)]["floor_ms"] = f["ms"]
            out[str(scale)]["state_over_floor"] = round(out[str(scale)]["state_ms"] / f["ms"], 2)
    return out


def recorder_whole_runs(scratch: str, scales: tuple[float, ...] = WHOLE_RUN_SCALES) -> dict[str, Any]:
    """The recorder scenario end to end per scale, as the command line runs it (every crash point)."""
    out: dict[str, Any] = {}
    for scale in scales:
        run_dir = os.path.join(scratch, f"recorder-whole-{scale}")
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "cli.main", "run", "scenario:recorder", "--fs", "ext4",
                            "--scale", str(scale), "--max-states", "all", "--out", run_dir],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - t0
        if p.returncode not in (0, 1):
            raise RuntimeError(f"recorder scenario at scale {scale}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
        with open(os.path.join(run_dir, "report.json")) as f:
            r = json.load(f)
        before_s, before_rate = ISSUE_16_BEFORE.get(str(scale), (None, None))
        walk = r["crash_walk"]["seconds"]
        out[str(scale)] = {"seconds": round(seconds, 2), "walk_seconds": walk,
                           "states_checked": r["crash_states_checked"],
                           "states_per_s": round(r["crash_states_checked"] / walk, 1) if walk else None,
                           "findings": len(r["findings"]), "issue_16_before_seconds": before_s,
                           "issue_16_before_states_per_s": before_rate,
                           "speedup_vs_issue_16": round(before_s / seconds, 1) if before_s else None}
    return out


class _Reference:
    """inspect_extra: a reference oracle (sector by sector, or in full) on the image the run's one just read."""

    def __init__(self, runner: ExecutorWorkload, out: str, mode: str = "sector") -> None:
        self.runner, self.out, self.mode = runner, out, mode
        self.oracle: ContentOracle | None = None
        self.seconds = 0.0
        self.states = 0
        self.found: list[tuple[str, str, str]] = []

    def __call__(self, mnt: str, cs: CrashState) -> list:
        if self.oracle is None:
            with LogReader(os.path.join(self.out, "recording.log")) as reader:
                marks = log_marks(reader)
            plan = self.runner.plan
            history = build_history(plan, read_records(os.path.join(self.out, "records.bin"), plan), marks)
            self.oracle = ContentOracle(history, plan.wid, "ext4", dict(self.runner.workload.invariants or {}))
            if self.mode == "sector":
                self.oracle.bulk = False
            self.oracle.incremental = False
        t0 = time.perf_counter()
        found = self.oracle.inspect(mnt, cs.point, cs.id)
        self.seconds += time.perf_counter() - t0
        self.states += 1
        self.found += [(cs.id, f.kind, f.detail) for f in found]
        return []


def incremental_vs_full(scratch: str, scale: float = 0.04, budget: int = BUDGET) -> dict[str, Any]:
    r = bulk_vs_sector(scratch, scale, budget, mode="full")
    return {"scale": scale, "states": r["states"], "incremental_ms_per_state": r["bulk_ms_per_state"],
            "full_ms_per_state": r["sector_ms_per_state"], "speedup": r["speedup"],
            "same_loss_rows": r["same_loss_rows"], "same_findings": r["same_findings"], "findings": r["findings"]}


def bulk_vs_sector(scratch: str, scale: float = 0.02, budget: int = BUDGET, mode: str = "sector") -> dict[str, Any]:
    runner = _recorder(scale)
    out = os.path.join(scratch, f"recorder-ref-{mode}-{scale}")
    ref = _Reference(runner, out, mode)
    res = run_checked(runner, RunConfig.parse({"fs": "ext4", "quiet": True, "max_states": budget}), out, ref)
    bulk_ms = res.report["oracle"]["ms_per_state"]
    ref_ms = 1000 * ref.seconds / max(1, ref.states)
    def rows(rs: list[dict[str, Any]]) -> list[str]:
        return sorted(json.dumps(r, sort_keys=True) for r in rs)
    same = rows(res.report["design"]["records"]["rows"]) == rows(ref.oracle.loss_rows if ref.oracle else [])
    content = sorted((f.evidence.get("state_id", ""), f.kind, f.detail) for f in res.findings
                     if f.kind in ("durability", "stale-data", "atomicity", "design"))
    return {"scale": scale, "states": ref.states, "bulk_ms_per_state": bulk_ms, "sector_ms_per_state": round(ref_ms, 2),
            "speedup": round(ref_ms / bulk_ms, 1) if bulk_ms else None, "same_loss_rows": same,
            "same_findings": content == sorted(ref.found), "findings": len(res.findings)}
