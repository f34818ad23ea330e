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

from checkers.documented_bugs import triage
from checkers.findings import Finding
from checkers.known_damage import KnownDamage, configuration_without_metadata_journal
from conftest import WORKLOADS, PcEnv, needs_root_stack
from fuzz.trial import signature
from test_fuzz import campaign
from workloads.plan import parse_plan

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


def test_a_sync_covers_its_reorderings_too() -> None:
    """A sync's mark at 9 after writes at 5 and 8, a flush at 6 between them: the write at 8 was
    unflushed when sync returned, but sync(2) promised it durable (docs/bugs/ext4-nojournal-sync-unflushed.md):
    damage in a reordered state that lost it is a finding, as in the state that has it."""
    k = KnownDamage("ext4 -O ^has_journal", syncs=[9], writes=[5, 8, 12])
    damage = [Finding("fsck", "bitmap differences", crash_point=10, state_id=s) for s in ("p10", "p10-d8")]
    assert k.split(damage) == (damage, [])
    before = Finding("fsck", "bitmap differences", crash_point=8, state_id="p8-d5")
    assert k.split([before]) == ([], [before])


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


@pytest.mark.e2e
@needs_root_stack
def test_a_reordering_that_loses_a_syncs_unflushed_write_is_the_documented_bug(pc: PcEnv) -> None:
    """Through the FUSE recorder on the host's kernel: sync(2) writes the block device's buffers
    (the bitmaps, group descriptors and inode table A/g's delayed allocation dirtied) after
    ext4_sync_fs's flush, so they sit between the last FLUSH and the sync's mark, and a crash
    state at the mark that drops one is a finding: the documented bug, not expected damage."""
    out = pc.tmp / "run"
    p = pc.run("run", str(WORKLOADS / "unjournaled_sync.json"), *NO_JOURNAL[:4], "--out", str(out), check_rc=1)
    r = json.loads((out / "report.json").read_text())
    synced = op_marks(pc, out / "recording.log")["op 0.9.0"]
    dump = pc.run("log", "dump", str(out / "recording.log"), check_rc=0).stdout
    flags = {int(m[1]): m[2] for m in re.finditer(r"^(\d+) sector=\d+ nr_sectors=\d+ flags=(\S+)", dump, re.M)}
    last_flush = max(i for i, f in flags.items() if i < synced and "FLUSH" in f)
    tail = [i for i in range(last_flush + 1, synced) if flags.get(i) == "NONE"]
    assert tail, dump  # the kernel's order (fs/sync.c): the writes follow the flush
    tagged = [f for f in r["findings"] if "unflushed_sync" in f.get("evidence", {})]
    assert tagged and all(f["evidence"]["unflushed_sync"] == synced for f in tagged), r["findings"]
    assert all(re.fullmatch(rf"p\d+-d({'|'.join(map(str, tail))})", f["state_id"]) for f in tagged), tagged
    assert all(row["crash_point"] < synced for row in r["expected_damage"]["rows"]), r["expected_damage"]
    doc = json.loads((WORKLOADS / "unjournaled_sync.json").read_text())
    plan = parse_plan((out / "plan.txt").read_text())
    for f in tagged:
        sig = signature(Finding(**f), plan).key()
        t = triage(fs="ext4", mkfs_opts="-O ^has_journal", signature=sig, doc=doc, kernel=r["kernel"])
        assert t.bug == "ext4-nojournal-sync-unflushed", (sig, t)
    assert "[durability]" in p.stdout or "[fsck]" in p.stdout, p.stdout
    assert pc.leftovers() == []
