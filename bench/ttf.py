"""Time to find: how many minutes a default vm campaign needs to find a known kernel bug.

Each bug of the table (bench/bugpairs.json) is a pair of Debian kernel
packages: `buggy` has the bug, `fixed` is the first package with the fix.
For each bug, `powercut fuzz --backend vm` runs on the buggy kernel with the
project's default fuzz settings (only the file system, its mkfs/mount
options and recovery mode come from the table; no seed, corpus entry or
known workload is given), in sessions of `--max-findings 1`: when a session
saves a finding, the finding's own shrunk workload is run on the fixed
kernel (the bisect machinery, fuzz/bisect.py). A finding that is clean there
is the bug's; the clock stops at the moment that finding was saved. The
re-check first runs it on the buggy kernel again, up to three times for a
race with the kernel's background work, and then as many times on the
fixed kernel, each clean. A finding that shows on the fixed kernel too is reported but does not count,
and the campaign resumes (`--resume`) for the rest of the budget. Campaign
time only: the fixed-kernel re-checks are timed on their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from foundation import ownership, paths
from foundation.errors import UsageError
from foundation.jsondoc import write_json
from fuzz.bisect import Bisection, KernelChoice, from_finding
from fuzz.store import FindingStore
from harness.pipeline.config import RunConfig

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bugpairs.json")
POLL_S = 2.0
_DEBIAN = "debian:linux-image-"


@dataclass(frozen=True)
class Bug:
    id: str
    fs: str
    buggy: str                       # Debian package name with the bug
    fixed: str                       # the first package with the fix
    mkfs_opts: str = ""
    mount_opts: str = ""
    recovery: str = ""               # "" (rw), "ro" or "both"
    fault: str = ""                  # tests only: a harness fault that stands in for the bug on the buggy side
    fuzz_args: list[str] = field(default_factory=list)  # tests only: extra `powercut fuzz` options
    fix: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    validation: str = ""
    # The hand-written workload that confirmed the pair (bench/validation/, relative to the
    # checkout). Documentation and tests only: the campaign never sees it.
    workload: str = ""

    def kernel(self, which: str) -> str:
        return "debian:" + (self.buggy if which == "buggy" else self.fixed)


def load_table(path: str = TABLE) -> list[Bug]:
    try:
        with open(path) as f:
            doc = json.load(f)
        bugs = [Bug(**b) for b in doc["bugs"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise UsageError(f"{path}: not a bug table ({e})") from None
    for b in bugs:
        if not (b.buggy.startswith("linux-image-") and b.fixed.startswith("linux-image-")):
            raise UsageError(f"{path}: {b.id}: buggy and fixed must be Debian kernel packages (linux-image-...)")
    return bugs


def select(bugs: list[Bug], ids: str) -> list[Bug]:
    if not ids:
        return bugs
    want = [i for i in ids.split(",") if i]
    known = {b.id: b for b in bugs}
    unknown = [i for i in want if i not in known]
    if unknown:
        raise UsageError(f"--bugs: unknown {', '.join(unknown)}; the table has {', '.join(known)}")
    return [known[i] for i in want]


def _fuzz_argv(bug: Bug, cdir: str, resume: bool, seconds: float, jobs: int) -> list[str]:
    argv = [sys.executable, "-m", "cli", "fuzz", "--duration", f"{max(int(seconds), 1)}s", "--jobs", str(jobs),
            "--max-findings", "1"]
    if resume:
        return argv + ["--resume", cdir]
    argv += ["--fs", bug.fs, "--backend", "vm", "--kernel", bug.kernel("buggy"), "--out", cdir]
    if bug.mkfs_opts:
        argv += ["--mkfs-opts", bug.mkfs_opts]
    if bug.mount_opts:
        argv += ["--mount-opts", bug.mount_opts]
    if bug.recovery:
        argv += ["--recovery", bug.recovery]
    if bug.fault:
        argv += ["--fault", bug.fault]
    return argv + bug.fuzz_args


def _findings(cdir: str) -> list[str]:
    """The campaign's saved findings (their directory names), complete ones only."""
    d = os.path.join(cdir, "findings")
    return [s["dir"] for s in FindingStore(d).saved()] if os.path.isdir(d) else []


def _session(argv: list[str], cdir: str, log: str, clock0: float, seen: dict[str, float]) -> int:
    """Run one `powercut fuzz` session; note when each finding appears (campaign minutes since clock0)."""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=paths.ROOT)
        try:
            while p.poll() is None:
                for f in _findings(cdir):
                    seen.setdefault(f, clock0 + time.monotonic())
                time.sleep(POLL_S)
        except BaseException:
            p.terminate()  # the campaign tears its workers down on SIGTERM
            p.wait()
            raise
    for f in _findings(cdir):
        seen.setdefault(f, clock0 + time.monotonic())
    return p.returncode


def _verdict(workload: str, cfg: RunConfig, kernel: str, out: str) -> tuple[str, int, str]:
    b = Bisection(workload, cfg, [KernelChoice(kernel)], out)
    verdict = b.verdict(0)
    return verdict, b.tested[0].findings, b.tested[0].out


# A finding whose workload races the kernel's background work (xfs inodegc, btrfs delayed iputs)
# may not show in every run: the buggy side gets this many runs to show it again.
RECHECK_TRIES = 3


def _runs_while_clean(workload: str, cfg: RunConfig, kernel: str, out: str, side: str,
                      limit: int) -> list[tuple[str, int, str]]:
    """WORKLOAD on KERNEL up to LIMIT times, until a run is not clean; each run's (verdict,
    findings, run directory), the directories OUT/SIDE, OUT/SIDE-2, ..."""
    runs: list[tuple[str, int, str]] = []
    while len(runs) < limit and (not runs or runs[-1][0] == "clean"):
        name = side if not runs else f"{side}-{len(runs) + 1}"
        runs.append(_verdict(workload, cfg, kernel, os.path.join(out, name)))
    return runs


def recheck(bug: Bug, finding_dir: str, out: str) -> dict[str, Any]:
    """The finding's shrunk workload again on the buggy kernel (a finding that does not come back there
    in RECHECK_TRIES runs, say a harness hiccup, is not the bug) and on the fixed kernel, with the bug's
    configuration, in as many runs as the buggy side needed, each clean; a test table's fault stands in
    for the bug on the buggy side only."""
    workload, cfg = from_finding(finding_dir)
    t0 = time.monotonic()
    buggy_runs = _runs_while_clean(workload, cfg, bug.kernel("buggy"), out, "buggy", RECHECK_TRIES)
    buggy = buggy_runs[-1][0]
    again = buggy != "clean" and not buggy.startswith("error")
    cfg = RunConfig.parse({**cfg.to_json(), "fault": None})  # the flat form: the fault is a backend option
    fixed_runs = _runs_while_clean(workload, cfg, bug.kernel("fixed"), out, "fixed", len(buggy_runs) if again else 1)
    fixed, n_fixed, fixed_out = fixed_runs[-1]
    with open(os.path.join(finding_dir, "finding.json")) as f:
        info = json.load(f)
    return {"finding": os.path.basename(finding_dir), "kind": info.get("kind"),
            "signature": (info.get("signatures") or [""])[0], "ops": info.get("ops"),
            "buggy_verdict": buggy, "buggy_runs": [r[0] for r in buggy_runs], "fixed_kernel": bug.kernel("fixed"),
            "fixed_verdict": fixed, "fixed_runs": [r[0] for r in fixed_runs],
            "fixed_findings": n_fixed, "counts": again and fixed == "clean",
            "recheck_seconds": round(time.monotonic() - t0, 1), "recheck_out": fixed_out}


def run_bug(bug: Bug, out: str, minutes: float, jobs: int) -> dict[str, Any]:
    """One bug's campaign on its buggy kernel, re-checking each finding on the fixed kernel."""
    ownership.make_dir(out)
    cdir, log = os.path.join(out, "campaign"), os.path.join(out, "fuzz.log")
    budget, campaign_s, sessions = minutes * 60, 0.0, 0
    seen: dict[str, float] = {}
    checked: list[dict[str, Any]] = []
    found: dict[str, Any] | None = None
    exit_codes = []
    while found is None and budget - campaign_s >= 1:
        argv = _fuzz_argv(bug, cdir, sessions > 0, budget - campaign_s, jobs)
        t0 = time.monotonic()
        rc = _session(argv, cdir, log, campaign_s - t0, seen)
        campaign_s += time.monotonic() - t0
        sessions += 1
        exit_codes.append(rc)
        # Even a session that ended badly (a worker died: 3) may have saved findings: check them.
        new = [f for f in _findings(cdir) if f not in {c["finding"] for c in checked}]
        if not new:
            break  # the budget is spent (or the engine ran out) without a finding
        for f in new:
            c = recheck(bug, os.path.join(cdir, "findings", f), os.path.join(out, "recheck", f))
            c["found_at_minutes"] = round(seen[f] / 60, 2)
            checked.append(c)
            if c["counts"]:
                found = c
                break  # later findings of the same session need no re-check: the clock has stopped
        if rc not in (0, 1, 3):
            break  # a usage/environment error (2) or an interrupt: fuzz.log says which
        # 3: a worker died of a powercut bug (fuzz.log, the campaign's error.txt); the campaign resumes
        # for the rest of the budget, and fuzz_exit_codes shows it happened.
    return {
        "id": bug.id, "fs": bug.fs, "buggy_kernel": bug.kernel("buggy"), "fixed_kernel": bug.kernel("fixed"),
        "mkfs_opts": bug.mkfs_opts, "mount_opts": bug.mount_opts, "recovery": bug.recovery or "rw",
        "fix": bug.fix, "budget_minutes": minutes, "jobs": jobs,
        "found": found is not None, "minutes_to_find": found["found_at_minutes"] if found else None,
        "finding": found, "findings_checked": checked,
        "not_counted": [c for c in checked if not c["counts"]],
        "campaign_minutes": round(campaign_s / 60, 2), "sessions": sessions, "fuzz_exit_codes": exit_codes,
        "campaign_dir": cdir, "fuzz_log": log,
    }


def time_to_find(out: str, minutes: float, jobs: int, ids: str = "", table: str = TABLE) -> dict[str, Any]:
    bugs = select(load_table(table), ids)
    if minutes <= 0 or jobs < 1:
        raise UsageError("--minutes must be positive and --jobs at least 1")
    ownership.make_dir(out)
    started = time.time()
    results = []
    for bug in bugs:  # one bug at a time: its --jobs guests have the machine
        results.append(run_bug(bug, os.path.join(out, bug.id), minutes, jobs))
        doc = _doc(results, table, minutes, jobs, started)
        write_json(os.path.join(out, "time-to-find.json"), doc)  # partial results survive a stop
    return _doc(results, table, minutes, jobs, started)


def _doc(results: list[dict[str, Any]], table: str, minutes: float, jobs: int, started: float) -> dict[str, Any]:
    return {"powercut_time_to_find": 1, "table": table, "budget_minutes": minutes, "jobs": jobs,
            "started": started, "loadavg": [round(x, 1) for x in os.getloadavg()],
            "found": sum(r["found"] for r in results), "bugs": len(results), "results": results}


def summary(doc: dict[str, Any]) -> str:
    lines = [f"time to find: {doc['found']} of {doc['bugs']} bugs found within {doc['budget_minutes']} min "
             f"(--jobs {doc['jobs']})"]
    for r in doc["results"]:
        k = f"{r['buggy_kernel'].removeprefix(_DEBIAN)} -> {r['fixed_kernel'].removeprefix(_DEBIAN)}"
        what = f"found in {r['minutes_to_find']} min ({r['finding']['kind']}, {r['finding']['ops']} ops)" \
            if r["found"] else f"missed ({r['campaign_minutes']} min)"
        extra = f"; {len(r['not_counted'])} finding(s) also on the fixed kernel" if r["not_counted"] else ""
        lines.append(f"  {r['id']} ({r['fs']}, {k}): {what}{extra}")
    return "\n".join(lines)
