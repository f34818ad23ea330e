"""Kernel coverage from the guest (harness/backends/vm/coverage.py, pc-cover): real runs on a
Debian kernel, whose ext4 functions are counted by BPF on a kprobe-multi link.

A plain write + fsync workload and the same with fallocate and a rename: both runs' maps are
non-empty on both paths, and the second reaches ext4 functions the first does not (the
fallocate and rename entry points among them); the recovery mounts of their crash states
replay the journal (jbd2's recovery functions are in the recovery path, not in the workload's).
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
           "--out", str(out), check_rc=0)
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
