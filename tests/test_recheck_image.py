"""`powercut recheck RUN --state ID --image IMG`: a board's disk, checked against
the guarantees of one crash state of a saved run, through the real stack
(loop device, the host kernel's recovery mount, fsck, the oracle)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from common import require_root_stack
from conftest import PcEnv

pytestmark = [pytest.mark.e2e, require_root_stack]

WORKLOAD = Path(__file__).parent / "workloads" / "rename_fsync.json"


def mounted_edit(image: Path, mnt: Path, edit) -> None:
    """Change IMAGE's files the way a broken kernel might have left them."""
    mnt.mkdir(exist_ok=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        edit(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_recheck_image_same_verdict_untouched_and_findings_when_changed(pc: PcEnv) -> None:
    out = pc.tmp / "run"
    pc.run("run", str(WORKLOAD), "--fs", "ext4", "--out", str(out), "--reorder", "none", check_rc=0)
    report = json.loads((out / "report.json").read_text())
    assert report["semantics"] == "linux" and report["oracle"]["semantics"] == "linux"
    last = f"p{report['log_entries'] - 1}"
    size = str(report["device_bytes"])
    img = pc.tmp / "board.img"
    pc.run("crash-image", "--log", str(out / "recording.log"), "--state", last, "--size", size, "--out", str(img),
           check_rc=0)
    before = img.read_bytes()

    # Untouched: the same verdict as the state rebuilt from the log; the image is not written.
    pc.run("recheck", str(out), "--state", last, check_rc=0)
    pc.run("recheck", str(out), "--state", last, "--image", str(img), check_rc=0)
    assert img.read_bytes() == before

    # The rename undone (the fsync after it promised it): a linux-tier finding only.
    renamed = pc.tmp / "renamed.img"
    shutil.copy(img, renamed)
    mounted_edit(renamed, pc.tmp / "mnt", lambda m: os.rename(m / "d/bar", m / "d/foo"))
    p = pc.run("recheck", str(out), "--state", last, "--image", str(renamed), check_rc=1)
    assert "fsync-names" in p.stdout or "d/bar" in p.stdout, p.stdout
    pc.run("recheck", str(out), "--state", last, "--image", str(renamed), "--semantics", "posix", check_rc=0)

    # The file at an older size than the fsync made durable: a finding in both tiers.
    short = pc.tmp / "short.img"
    shutil.copy(img, short)
    mounted_edit(short, pc.tmp / "mnt", lambda m: os.truncate(m / "d/bar", 4096))
    p = pc.run("recheck", str(out), "--state", last, "--image", str(short), "--semantics", "posix", check_rc=1)
    assert "size 4096" in p.stdout, p.stdout

    # A wrong-sized image or a missing one: a usage error, one line.
    wrong = pc.tmp / "wrong.img"
    wrong.write_bytes(b"\0" * 4096)
    p = pc.run("recheck", str(out), "--state", last, "--image", str(wrong), check_rc=2)
    assert "bytes" in p.stderr and "Traceback" not in p.stderr
    pc.run("recheck", str(out), "--state", last, "--image", str(pc.tmp / "nope.img"), check_rc=2)
