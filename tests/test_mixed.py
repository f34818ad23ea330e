"""The mixed engine, the default of `powercut fuzz --backend vm`: half the workers walk the
ordered ACE seq-2 space, the other half run Hypothesis; one worker alternates."""

from __future__ import annotations

import json

from common import journal
from conftest import PcEnv, needs_root_stack


@needs_root_stack
def test_mixed_splits_the_workers_between_the_ordered_space_and_hypothesis(pc: PcEnv) -> None:
    out = pc.tmp / "camp"
    p = pc.run("fuzz", "--fs", "ext4", "--backend", "fuse", "--engine", "mixed", "--jobs", "2",
               "--max-workloads", "6", "--duration", "10m", "--out", str(out), "--seed", "5")
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["engine"] == "mixed" and report["exhaustive"]["seq"] == 2
    names = {w: [e["name"] for e in journal(out, w) if not e.get("shrink")] for w in ("w0", "w1")}
    assert names["w0"] and all(n.startswith("ace2-") for n in names["w0"]), names
    assert names["w1"] and all(n.startswith("hyp-w1-") for n in names["w1"]), names
    # w0 walks the ordered space from its start: the likeliest shapes first
    assert sorted(names["w0"], key=lambda n: int(n.split("-")[1])) == [f"ace2-{i}" for i in range(len(names["w0"]))]


# The vm backend's default (mixed, no --engine) runs in tests/test_vm_install.py's campaign: one
# vm campaign for both (a guest boot per worker is the cost of each).
