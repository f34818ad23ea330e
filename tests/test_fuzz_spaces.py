"""Campaign options that choose which workloads run (--seq 3, --seq-cap, --shard), where the
hypothesis engine keeps its examples (--hypothesis-db), and campaigns on the other file
systems (xfs, btrfs), through the real stack.

Expected indices are computed by hand from the documented rules, not by
calling the enumeration: without --core-ops, seq 3 is the ordered space
(docs/fuzzing.md), whose --seq-cap N visits its first N indices; with
--core-ops it is the product of those core ops' steps (large-new: fsync,
fdatasync, fsync of its directory, sync; unlink: fsync, fsync of the parent,
sync: 7 steps, 7**3 = 343 workloads), whose --seq-cap N visits
k * space // N for k < N; --shard K/N keeps the indices i with i % N == K.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from common import journal, report, require_root_stack
from conftest import PcEnv

pytestmark = [pytest.mark.e2e, require_root_stack]


def campaign(pc: PcEnv, *args: str, engine: str = "exhaustive") -> tuple[dict, Path]:
    out = pc.tmp / "campaign"
    p = pc.run("fuzz", "--out", str(out), "--seed", "1", "--engine", engine, "--duration", "10m", *args)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert pc.leftovers() == []
    return report(out), out


def test_seq3_capped_and_sharded_runs_exactly_its_indices(pc: PcEnv) -> None:
    # The ordered space: --seq-cap 4 is its first 4 indices; shard 1/2: the odd ones.
    report, out = campaign(pc, "--fs", "ext4", "--seq", "3", "--seq-cap", "4", "--shard", "1/2")
    runs = journal(out)
    assert sorted(r["index"] for r in runs) == [1, 3], runs
    assert all(r["name"].startswith("ace3-") for r in runs), runs
    assert report["exhaustive"]["seq"] == 3 and report["findings_by_kind"] == {}
    assert report["stop_reason"] == "exhausted", report["stop_reason"]
    # The product of --core-ops: --seq-cap 4 over 343 is 0, 85, 171, 257; shard 1/2 keeps 85, 171
    # and 257; --max-workloads 2 runs the first two.
    (pc.tmp / "campaign").rename(pc.tmp / "ordered")
    report, out = campaign(pc, "--fs", "ext4", "--seq", "3", "--seq-cap", "4", "--shard", "1/2",
                           "--core-ops", "unlink,large-new", "--max-workloads", "2")
    runs = journal(out)
    assert sorted(r["index"] for r in runs) == [85, 171] and all(r["name"].startswith("seq3-") for r in runs), runs


@pytest.mark.parametrize("fs", ["xfs", "btrfs"])
def test_campaign_on_another_file_system(pc: PcEnv, fs: str) -> None:
    """The first two seq-1 workloads (creat then fsync, and its sibling) are clean on both."""
    report, out = campaign(pc, "--fs", fs, "--seq", "1", "--max-workloads", "2")
    assert report["fs"] == report["run"]["fs"] == fs and report["workloads"] == 2
    runs = journal(out)
    assert sorted(r["index"] for r in runs) == [0, 1] and all(r["states"] > 0 for r in runs), runs
    assert report["findings_by_kind"] == {} and report["harness_errors"] == 0


def test_hypothesis_db_directory_holds_the_examples(pc: PcEnv) -> None:
    """--hypothesis-db DIR (a directory another machine can share): Hypothesis writes its example
    database there when a round ends (here: when --max-workloads stops the campaign), not into
    the campaign directory."""
    db = pc.tmp / "shared-db"
    report, out = campaign(pc, "--fs", "ext4", "--max-workloads", "2", "--hypothesis-db", str(db),
                           engine="hypothesis")
    assert report["workloads"] == 2 and report["spec"]["options"]["hypothesis_db"] == str(db)
    assert any(d.is_dir() and any(d.iterdir()) for d in db.iterdir()), list(db.iterdir())
    assert not (out / "hypothesis-db").exists()
