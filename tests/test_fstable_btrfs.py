"""The btrfs rules that read transaction boundaries from the log (checkers/btrfs_commits.py):
each flags the fstests outcome it was made for, through the real stack (fuse recorder, this
host's btrfs), with the healthy run clean; and the control: where the log shows a commit
between the trigger and the fsync, the same plant is not claimed."""

from __future__ import annotations

import copy
import dataclasses
import subprocess

import pytest

from bench import fstable
from common import POWERCUT, WORKLOADS, require_root_stack
from conftest import PcEnv

# (row, the rule that must flag it, what its finding says)
ROWS = [
    ("generic-336", "btrfs-commit", "b/bar is a file"),          # the fsync fell back to a commit
    ("generic-104-b", "btrfs-log-dirs", "testdir/foo_link is missing"),  # bar's parent logged
    ("generic-065-b", "btrfs-log-dirs", "mydir/x/y/z/qwerty is missing"),  # the new subtree logged
    ("generic-066-b", "btrfs-relog", "foobar: xattr user.attr1 is present"),  # relogged by the link
]


@pytest.mark.e2e
@require_root_stack
@pytest.mark.parametrize("row_id,rule,says", ROWS)
def test_btrfs_rule_flags_its_fstests_outcome(pc: PcEnv, row_id: str, rule: str, says: str) -> None:
    """Up to three runs, each healthy-clean: btrfs 6.18 now and then commits on its own during a
    run, and the rules then stand down (checkers/btrfs_commits.py); one run must flag the plant."""
    (row,) = fstable.load_table(only=row_id)
    for attempt in range(3):
        r = fstable.run_row(row, "btrfs", str(pc.tmp / f"row{attempt}"), env=pc.env())
        assert "error" not in r, r
        assert r["healthy_rc"] == 0, r["healthy_findings"]
        if r["flagged"]:
            break
    assert r["flagged"] is True, r
    assert any(says in f for f in r["recheck_findings"]), r["recheck_findings"]
    if rule != "btrfs-relog":  # name findings end with the rule's promise; xattr ones name the op
        assert rule in fstable.rules_named(r["recheck_findings"]), r["recheck_findings"]


@pytest.mark.e2e
@require_root_stack
def test_a_commit_between_the_link_and_the_fsync_lifts_the_claim(pc: PcEnv) -> None:
    """generic/104 with a sync between bar's link and foo's: bar's fsync then has no name change
    in its transaction, btrfs logs no parent, and foo_link missing is a legal outcome."""
    (row,) = fstable.load_table(only="generic-104-b")
    wl = copy.deepcopy(row.workload)
    assert wl is not None
    ops = wl["threads"][0]["ops"]
    at = next(i for i, o in enumerate(ops) if o["op"] == "link" and o["to"] == "testdir/bar_link")
    ops.insert(at + 1, {"op": "sync"})
    r = fstable.run_row(dataclasses.replace(row, workload=wl), "btrfs", str(pc.tmp / "row"), env=pc.env())
    assert "error" not in r, r
    assert r["healthy_rc"] == 0 and r["flagged"] is False, r


@pytest.mark.e2e
@require_root_stack
@pytest.mark.parametrize("name", ["btrfs_new_file_link_fsync_parent", "btrfs_exchange_link_fsync_parent"])
def test_healthy_shapes_that_narrowed_the_log_dirs_rule_stay_clean(pc: PcEnv, name: str) -> None:
    """The healthy kernel's answers that narrowed `btrfs-log-dirs` (healthy campaigns found them):
    a file made in the running transaction, linked, fsynced (btrfs logs no parent in full for a
    new inode: the symlink made before it is not kept); and a RENAME_EXCHANGE of a dir and a file
    in the parent an old file's link then logs (the exchange is not kept). Both legal."""
    wl = WORKLOADS / f"{name}.json"
    p = subprocess.run([*POWERCUT, "run", str(wl), "--fs", "btrfs", "--out", str(pc.tmp / "run")],
                       env=pc.env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
