"""Kernel coverage from the guest (harness/backends/vm/coverage.py, pc-cover): real runs on a
Debian kernel, whose ext4 functions are counted by BPF on a kprobe-multi link.

A plain write + fsync workload and the same with fallocate and a rename: both runs' maps are
non-empty on both paths, and the second reaches ext4 functions the first does not (the
fallocate and rename entry points among them); the recovery mounts of their crash states
replay the journal (jbd2's recovery functions are in the recovery path, not in the workload's).
And the coverage engine finds a planted violation that only workloads running many ext4
functions show (the coverage-plant test fault).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common import vm
from conftest import PcEnv

pytestmark = [*vm]

KERNEL = "debian:linux-image-6.12-amd64"
PLAIN = [{"op": "open", "path": "f", "flags": ["O_CREAT", "O_RDWR"], "fd": "f"},
         {"op": "pwrite", "fd": "f", "offset": 0, "length": 8192},
         {"op": "fsync", "fd": "f"}]
MORE = [*PLAIN,
        {"op": "fallocate", "fd": "f", "mode": [], "offset": 8192, "length": 65536},
        {"op": "rename", "from": "f", "to": "g"},
        {"op": "fsync", "fd": "f"}]


def coverage_of(pc: PcEnv, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
    path = pc.tmp / f"{name}.json"
    path.write_text(json.dumps({"format": "powercut-workload/1", "name": name,
                                "threads": [{"name": "main", "ops": [*ops, {"op": "close", "fd": "f"}]}]}))
    out: Path = pc.tmp / f"out-{name}"
    pc.run("run", str(path), "--fs", "ext4", "--backend", "vm", "--kernel", KERNEL, "--max-states", "20",
           "--out", str(out), check_rc=0, env=pc.env(POWERCUT_VM_COVERAGE="on"))  # off unless asked (coverage.py)
    return json.loads((out / "report.json").read_text())["coverage"]


def test_coverage_map_is_non_empty_and_grows_with_a_workload_reaching_new_functions(pc: PcEnv) -> None:
    plain, more = coverage_of(pc, "plain", PLAIN), coverage_of(pc, "more", MORE)
    for cov in (plain, more):
        assert cov["available"] and cov["modules"] == ["ext4", "jbd2", "blk-flush"]
        assert cov["workload"]["functions"] > 0 and cov["recovery"]["functions"] > 0
        assert cov["workload"]["functions"] == len(cov["workload"]["hits"])
        assert all(n > 0 for n in cov["workload"]["hits"].values())
        # Recovery mounts of crash states with a dirty journal replay it; the workload never does.
        assert "jbd2_journal_recover" in cov["recovery"]["hits"]
        assert "jbd2_journal_recover" not in cov["workload"]["hits"]
    new = set(more["workload"]["hits"]) - set(plain["workload"]["hits"])
    assert {"ext4_fallocate", "ext4_rename2"} <= new, sorted(new)
    assert more["total_functions"] > plain["total_functions"]
    assert pc.leftovers() == []


# Functions of ext4 + jbd2 a workload path must run for the planted violation. The engine's
# random workloads have 2-4 op records here (--min-ops/--max-ops); kept workloads grow to 8 by
# joining and inserting. 4 records seldom reach this many (random workloads of up to 8 records
# ran 79-271 functions, docs/coverage.md), so it is mostly a workload grown from kept ones.
PLANT = "240"


def test_a_violation_only_coverage_rich_paths_reach_is_found_by_the_coverage_engine(pc: PcEnv) -> None:
    out = pc.tmp / "campaign"
    p = pc.run("fuzz", "--out", str(out), "--fs", "ext4", "--backend", "vm", "--kernel", KERNEL,
               "--engine", "coverage", "--fault", "coverage-plant", "--seed", "3", "--max-states", "5",
               "--min-ops", "2", "--max-ops", "4", "--max-findings", "1", "--max-workloads", "60", "--shrink-seconds", "1", "--duration", "30m",
               timeout=2400, env={**pc.env(), "POWERCUT_VM_PLANT_FUNCTIONS": PLANT})
    assert p.returncode == 1, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    report = json.loads((out / "report.json").read_text())
    saved = [s for s in report["saved_findings"] if s["signature"].endswith("workload:coverage-plant")]
    assert saved, report["saved_findings"]
    entries = [json.loads(line) for f in sorted((out / "journal").iterdir()) for line in f.read_text().splitlines()]
    runs = [e for e in entries if e.get("engine") == "coverage" and not e.get("shrink")]
    first = next(i for i, e in enumerate(runs) if any(s.endswith("coverage-plant") for s in e.get("signatures", [])))
    assert runs[first]["coverage"]["workload"] >= int(PLANT)
    # The corpus at work: random workloads first, then mutations of kept ones (the run that found
    # the plant was a mutation in one of two runs measured, a random 4-record workload in the other).
    assert not runs[0]["mutated"]
    if first >= 6:  # past the engine's random seeds: most runs are mutations of kept workloads
        assert any(e["mutated"] for e in runs[:first + 1])
    # The campaign's report has its coverage: the union and its growth over time.
    cov = report["coverage"]
    assert cov["workload_functions"] >= int(PLANT) and cov["recovery_functions"] > 0
    assert cov["over_time"] and cov["over_time"][-1][1] == cov["workload_functions"]
    assert pc.leftovers() == []
