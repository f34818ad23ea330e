"""The oracle against fstests' own power-fail verdicts (bench/fstable.py,
docs/semantics.md): the table's rows load, no generator reads them, and a
representative subset runs end to end (healthy run on this host's kernel,
the buggy outcome planted through the real file system, recheck --image)."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from bench import fstable
from common import GENERATOR_PACKAGES, ROOT, require_root_stack
from conftest import PcEnv
from foundation.errors import UsageError
from harness.corpus.entries import CORPUS_DIR, load_corpus


def test_every_row_loads_and_rows_not_run_say_why() -> None:
    rows = fstable.load_table()
    tests = {r.test for r in rows}
    assert any(t.startswith("generic/") for t in tests) and any(t.startswith("btrfs/") for t in tests)
    for r in rows:
        assert set(r.fs) <= {"ext4", "xfs", "btrfs"}, r.id
        if r.workload is None or not r.plant:
            assert r.reason, r.id
        for step in r.plant:
            if step[0] == "old":  # the older write's bytes can be made from the workload
                assert len(fstable.old_bytes(r.workload, step[2], step[3], 512)) == 512, r.id


def test_a_bad_row_is_one_clear_error(tmp_path: Path) -> None:
    good = json.loads((Path(fstable.TABLE_DIR) / "generic-322.json").read_text())
    for broken, words in (({**good, "plant": [["explode", "x"]]}, "bad plant step"),
                          ({**good, "plant": [], "reason": ""}, "needs a reason"),
                          ({**good, "format": "x"}, "format")):
        p = tmp_path / "row.json"
        p.write_text(json.dumps(broken))
        with pytest.raises(UsageError, match=words):
            fstable.load_row(str(p))


def test_no_generator_reads_the_fstests_table() -> None:
    """No module below bench/ names the table, and the corpus walk does not reach it (benchmark
    honesty: these are fstests' own sequences; a generator seeded with them would find what it
    was shown)."""
    for pkg in GENERATOR_PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            assert "fstests_powerfail" not in text and "fstable" not in text, path
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ImportFrom) and node.module:
                    assert not node.module.startswith("bench"), (path, node.module)
    assert not Path(fstable.TABLE_DIR).resolve().is_relative_to(CORPUS_DIR.resolve())
    names = {e.name for e in load_corpus()}
    assert not any(n.startswith("fst-") for n in names)


# One row per kind of promise and file system: names after fsync (ext4), data of a
# ranged msync (xfs), a file that must stay gone (btrfs).
SUBSET = [("generic-322", "ext4"), ("generic-325", "xfs"), ("generic-764", "btrfs")]


@pytest.mark.e2e
@require_root_stack
@pytest.mark.parametrize("row_id,fs", SUBSET)
def test_planted_outcome_is_flagged_and_the_healthy_run_is_clean(pc: PcEnv, row_id: str, fs: str) -> None:
    (row,) = fstable.load_table(only=row_id)
    r = fstable.run_row(row, fs, str(pc.tmp / "row"), env=pc.env())
    assert "error" not in r, r
    assert r["healthy_rc"] == 0, r["healthy_findings"]
    assert r["flagged"] is True, r
    assert r["recheck_findings"], r


@pytest.mark.e2e
@require_root_stack
def test_an_image_planted_with_no_change_is_not_flagged(pc: PcEnv) -> None:
    """The control: the same path with an edit that keeps the promise (a truncate to the size
    the file has) ends clean, so "flagged" is the oracle's verdict on the plant, not the route."""
    (row,) = fstable.load_table(only="generic-322")
    same = dataclasses.replace(row, plant=[["truncate", "bar", 1 << 20]])
    r = fstable.run_row(same, "ext4", str(pc.tmp / "row"), env=pc.env())
    assert "error" not in r, r
    assert r["healthy_rc"] == 0 and r["flagged"] is False, r
