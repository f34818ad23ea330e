"""`powercut corpus diff`: two synthetic results files, no run needed."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import PcEnv
from harness.corpus.run import RESULTS_FORMAT


def results(path: Path, kernel: str, verdicts: dict[str, list[str] | None], p99: float = 100.0) -> Path:
    cases = {key: {"verdict": v, "error": "" if v is not None else "boom",
                   "latency": {"fsync": {"p99_us": p99, "max_us": 2 * p99}}} for key, v in verdicts.items()}
    path.write_text(json.dumps({"format": RESULTS_FORMAT, "kernel": kernel, "backend": "fuse", "cases": cases}))
    return path


def test_same_verdicts_exit_0_with_latency_side_by_side(pc: PcEnv) -> None:
    a = results(pc.tmp / "a.json", "6.1.0", {"x@ext4-ordered": [], "y@ext4-ordered": ["fsck"]})
    b = results(pc.tmp / "b.json", "6.12.1", {"x@ext4-ordered": [], "y@ext4-ordered": ["fsck"]}, p99=300.0)
    p = pc.run("corpus", "diff", str(a), str(b), "--out", str(pc.tmp / "d.md"), check_rc=0)
    assert "no verdict change" in p.stdout and "6.1.0" in p.stdout and "6.12.1" in p.stdout
    assert "| x@ext4-ordered | fsync | 100 | 300 | 3.00x | 200 | 600 | 3.00x |" in p.stdout
    assert (pc.tmp / "d.md").read_text() == p.stdout


def test_a_verdict_change_exits_1(pc: PcEnv) -> None:
    a = results(pc.tmp / "a.json", "6.1.0", {"x@r": [], "y@r": [], "z@r": []})
    b = results(pc.tmp / "b.json", "6.12.1", {"x@r": ["stale-data"], "y@r": None, "z@r": []})
    p = pc.run("corpus", "diff", str(a), str(b), check_rc=1)
    assert "**2 verdict changes**" in p.stdout
    assert "| x@r | clean | stale-data | **changed** |" in p.stdout
    assert "| y@r | clean | error: boom | **changed** |" in p.stdout


def test_not_a_results_file_exits_2_with_one_line(pc: PcEnv) -> None:
    bad = pc.tmp / "bad.json"
    bad.write_text("{}")
    p = pc.run("corpus", "diff", str(bad), str(bad), check_rc=2)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a corpus results file" in lines[0]


def test_corpus_run_kernel_needs_the_vm_backend(pc: PcEnv) -> None:
    p = pc.run("corpus", "run", "--entries", "append-fsync", "--rows", "ext4-ordered",
               "--kernel", "debian:linux-image-6.12-amd64", "--out", str(pc.tmp / "out"), check_rc=2)
    assert p.stderr.strip() == "powercut: --kernel and --kernel-modules need --backend vm"
