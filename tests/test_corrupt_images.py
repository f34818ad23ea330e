"""Corrupt crash images are findings, never crashes; a kept image crosses file systems.

ext4 without a journal, every write a crash point, multi-sector writes torn
into 512-byte pieces: directory blocks whose checksum no longer matches, so
the kernel answers EBADMSG when the content oracle reads them (and e2fsck
fails on many states). The vm backend's variant is in test_vm_backend.py.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import WORKLOADS, PcEnv, needs_root_stack

pytestmark = [pytest.mark.e2e, needs_root_stack]

# fsck and corruption are that configuration's known damage: asked for as findings here.
TORN_UNJOURNALED = ["--fs", "ext4", "--mkfs-opts", "-O ^has_journal", "--known-damage-findings",
                    "--crash-points", "write", "--reorder", "torn:512", "--states-per-point", "1"]


def assert_corrupt_images_are_findings(out: Path, stdout: str, stderr: str) -> dict:
    """The run ended with a report whose findings include unreadable paths, each with path and errno."""
    assert "Traceback" not in stderr, stderr
    r = json.loads((out / "report.json").read_text())
    kinds = {f["kind"] for f in r["findings"]}
    assert {"fsck", "corruption"} <= kinds, kinds
    for f in r["findings"]:
        if f["kind"] == "corruption":
            ev = f["evidence"]
            assert ev["errno"] in ("EBADMSG", "EUCLEAN", "EIO", "ENOENT", "ELOOP", "ESTALE"), ev
            assert ev["path"] and f["detail"].startswith(f"after recovery, reading {ev['path']} fails: {ev['errno']}")
            assert f["state_id"] and f["crash_point"] is not None
    assert "corruption" in stdout
    return r


def test_unreadable_recovered_image_is_a_finding_on_fuse(pc: PcEnv) -> None:
    out = pc.tmp / "out"
    p = pc.run("run", str(WORKLOADS / "unjournaled_dirs.json"), *TORN_UNJOURNALED, "--out", str(out), check_rc=1)
    assert_corrupt_images_are_findings(out, p.stdout, p.stderr)
    assert pc.leftovers() == []


def test_keep_image_across_file_systems(tmp_path: Path) -> None:
    """Scratch on tmpfs, --out elsewhere: copy_file_range says EXDEV, the copy falls back to read/write."""
    shm = Path(tempfile.mkdtemp(prefix="pc-test-", dir="/dev/shm"))
    try:
        if os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip("/dev/shm and the test's directory are one file system here")
        pc = PcEnv(tmp_path / "state", shm / "scratch", tmp_path)
        out = tmp_path / "out"
        pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--keep-image", "--crash-points", "flush",
               "--reorder", "none", "--out", str(out), check_rc=0)
        r = json.loads((out / "report.json").read_text())
        kept = out / "final.img"
        assert kept.stat().st_size == r["device_bytes"]
        assert kept.stat().st_blocks * 512 < r["device_bytes"]  # still sparse
        # The kept image is the device at the end of the log.
        replayed = tmp_path / "replayed.img"
        pc.run("replay-log", "--log", str(out / r["log"]), "--replay", str(replayed), "--size",
               str(r["device_bytes"]), check_rc=0)
        assert kept.read_bytes() == replayed.read_bytes()
        assert pc.leftovers() == []
    finally:
        shutil.rmtree(shm, ignore_errors=True)
