"""ext4 without a journal promises no metadata consistency after a crash: damage in crash
states no completed sync covers is counted as the configuration's known behaviour
(report.json `expected_damage`), not reported as findings; what a completed fsync or
sync promised stays a finding (checkers/known_damage.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from checkers.findings import Finding
from checkers.known_damage import KnownDamage, configuration_without_metadata_journal, flushed
from conftest import WORKLOADS, PcEnv, needs_root_stack
from test_fuzz import campaign

NO_JOURNAL = ["--fs", "ext4", "--mkfs-opts", "-O ^has_journal", "--crash-points", "write"]


def test_only_ext4_without_a_journal_promises_no_metadata_consistency() -> None:
    assert configuration_without_metadata_journal("ext4", "-O ^has_journal") == "ext4 -O ^has_journal"
    assert configuration_without_metadata_journal("ext4", "-O ^has_journal,^metadata_csum") is not None
    assert configuration_without_metadata_journal("ext4", "-O fast_commit") is None
    assert configuration_without_metadata_journal("xfs", "") is None


def test_a_state_is_covered_by_a_sync_until_the_next_write() -> None:
    """State pN holds the entries up to N: the sync's mark at 10, writes at 5 and 12."""
    k = KnownDamage("ext4 -O ^has_journal", syncs=[10], writes=[5, 12])
    assert [p for p in range(16) if k.covered_by_sync(p)] == [10, 11]


def test_a_sync_that_wrote_after_its_flush_covers_only_prefix_states() -> None:
    """Writes at 5 and 8, a flush at 6: a mark at 7 has every write before it flushed, one at 9 not.
    A reordered state at the unflushed sync may have lost the write at 8: its damage is counted."""
    assert flushed(7, writes=[5, 8], flushes=[6]) and not flushed(9, writes=[5, 8], flushes=[6])
    assert flushed(3, writes=[5, 8], flushes=[6]) and not flushed(7, writes=[5, 8], flushes=[])
    k = KnownDamage("ext4 -O ^has_journal", syncs=[9], writes=[5, 8, 12], unflushed=frozenset({9}))
    assert k.covered_by_sync(10) and not k.covered_by_sync(10, prefix=False)
    damage = [Finding("fsck", "bitmap differences", crash_point=10, state_id=s) for s in ("p10", "p10-d8")]
    assert k.split(damage) == (damage[:1], damage[1:])


def op_marks(pc: PcEnv, log: Path) -> dict[str, int]:
    """Each op mark's text -> its log entry (`powercut log dump`)."""
    out = pc.run("log", "dump", str(log), check_rc=0).stdout
    return {m[2]: int(m[1]) for m in re.finditer(r'^(\d+) .* mark="(op [0-9.]+)"$', out, re.M)}


@pytest.mark.e2e
@needs_root_stack
def test_damage_before_a_sync_is_counted_and_what_sync_and_fsync_promised_is_a_finding(pc: PcEnv) -> None:
    out = pc.tmp / "run"
    p = pc.run("run", str(WORKLOADS / "unjournaled_sync.json"), *NO_JOURNAL, "--out", str(out), check_rc=0)
    r = json.loads((out / "report.json").read_text())
    known = r["expected_damage"]
    assert r["findings"] == [] and known["count"] > 0 and set(known["by_kind"]) <= {"fsck", "corruption", "mount"}
    assert "expected damage (ext4 -O ^has_journal" in p.stdout and "findings: none" in p.stdout
    assert "## Expected damage" in (out / "report.md").read_text()
    marks = op_marks(pc, out / "recording.log")
    fsynced, synced = marks["op 0.3.0"], marks["op 0.9.0"]  # right after the fsync of A/f; after the sync
    assert all(row["crash_point"] != synced for row in known["rows"])

    def image(state: str, edit: str, name: str) -> Path:
        """The crash image of STATE changed by debugfs EDIT the way a broken kernel might leave it."""
        img = pc.tmp / f"{name}.img"
        pc.run("crash-image", "--log", str(out / "recording.log"), "--state", state, "--size",
               str(r["device_bytes"]), "--out", str(img), check_rc=0)
        subprocess.run(["debugfs", "-w", "-R", edit, str(img)], check=True, capture_output=True)
        return img

    # Inode bitmap damage right after the sync returned: the sync promised a consistent image.
    bad = image(f"p{synced}", "freei /A", "synced")
    p = pc.run("recheck", str(out), "--state", f"p{synced}", "--image", str(bad), check_rc=1)
    assert "[fsck]" in p.stdout and "expected damage" not in p.stdout, p.stdout
    # The same damage before the sync: the configuration's known behaviour, counted.
    early = image(f"p{fsynced}", "freei /A", "early")
    p = pc.run("recheck", str(out), "--state", f"p{fsynced}", "--image", str(early), check_rc=0)
    assert "expected damage" in p.stdout and "findings: none" in p.stdout, p.stdout
    # The fsync'd file's blocks gone before the sync: fsync promised them, a finding all the same.
    shutil.copy(early, pc.tmp / "lost.img")
    subprocess.run(["debugfs", "-w", "-R", "punch /A/f 0", str(pc.tmp / "lost.img")], check=True, capture_output=True)
    p = pc.run("recheck", str(out), "--state", f"p{fsynced}", "--image", str(pc.tmp / "lost.img"), check_rc=1)
    assert "[durability]" in p.stdout and "A/f" in p.stdout, p.stdout
    assert pc.leftovers() == []


@pytest.mark.e2e
@needs_root_stack
def test_unjournaled_campaign_counts_damage_instead_of_saving_it(pc: PcEnv) -> None:
    report, out, text = campaign(pc, *NO_JOURNAL, "--max-workloads", "4", "--min-ops", "8", "--duration", "5m", rc=0)
    assert report["expected_damage"] > 0, text
    assert not {"fsck", "corruption", "mount"} & set(report["findings_by_kind"]), report["findings_by_kind"]
    assert "expected damage" in text
    journal = [json.loads(ln) for j in (out / "journal").glob("*.jsonl") for ln in j.read_text().splitlines()]
    assert sum(e.get("expected_damage", 0) for e in journal) == report["expected_damage"]
