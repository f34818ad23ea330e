"""The mixed engine, the default of `powercut fuzz --backend vm`: half the workers walk the
ordered ACE seq-2 space, the other half run Hypothesis; one worker alternates."""

from __future__ import annotations

import json
import os

import pytest

from conftest import PcEnv, needs_root_stack


def journal(out) -> list[dict]:
    return [json.loads(ln) for f in sorted((out / "journal").glob("*.jsonl")) for ln in f.read_text().splitlines()]


@needs_root_stack
def test_mixed_splits_the_workers_between_the_ordered_space_and_hypothesis(pc: PcEnv) -> None:
    out = pc.tmp / "camp"
    p = pc.run("fuzz", "--fs", "ext4", "--backend", "fuse", "--engine", "mixed", "--jobs", "2",
               "--max-workloads", "6", "--duration", "10m", "--out", str(out), "--seed", "5")
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["engine"] == "mixed" and report["exhaustive"]["seq"] == 2
    names = {f.stem: [json.loads(ln)["name"] for ln in f.read_text().splitlines() if '"shrink": true' not in ln]
             for f in (out / "journal").glob("*.jsonl")}
    assert names["w0"] and all(n.startswith("ace2-") for n in names["w0"]), names
    assert names["w1"] and all(n.startswith("hyp-w1-") for n in names["w1"]), names
    # w0 walks the ordered space from its start: the likeliest shapes first
    assert sorted(names["w0"], key=lambda n: int(n.split("-")[1])) == [f"ace2-{i}" for i in range(len(names["w0"]))]


@pytest.mark.e2e
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (apt-get, kernel cache, scratch dirs)")
def test_the_vm_backend_defaults_to_the_mixed_engine(pc: PcEnv) -> None:
    """No --engine with --backend vm: the ordered seq-2 space first (one worker: a stretch of it,
    then Hypothesis)."""
    out = pc.tmp / "camp"
    p = pc.run("fuzz", "--fs", "ext4", "--backend", "vm", "--kernel", "debian:linux-image-6.12-amd64",
               "--max-workloads", "2", "--duration", "20m", "--out", str(out), timeout=1500)
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["engine"] == "mixed" and report["exhaustive"] == {"seq": 2, "space": report["exhaustive"]["space"],
                                                                   "done": 2}
    assert [r["name"] for r in journal(out) if not r.get("shrink")] == ["ace2-0", "ace2-1"]
