"""Exports proven in the real tools: real kernel bugs, found by powercut on a
Debian kernel in the vm backend, exported, and run there again with a real
fstests checkout (`./check`) and as the standalone script.

Each finding is made the way a campaign makes it (fuzz.trial.run_doc with the
vm backend on the buggy kernel, fuzz.store.FindingStore.save). Then
`powercut export FINDING --verify BUGGY[,FIXED] --fstests DIR`: on the buggy
kernel the fstests test must fail and the script say REPRODUCED; on the fixed
kernel (where one is packaged) both must pass. The golden output is the
model's expectation, so it is checked here too.

Needs a built fstests checkout: POWERCUT_FSTESTS=DIR (README: "Exports in
real fstests"); without one these tests skip and say so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from common import POWERCUT
from conftest import WORKLOADS, PcEnv, needs_root_stack
from foundation import ownership
from fuzz.store import FindingStore
from fuzz.trial import run_doc
from harness.pipeline.config import RunConfig

FSTESTS = os.environ.get("POWERCUT_FSTESTS", "")
pytestmark = [
    pytest.mark.e2e, pytest.mark.vm, needs_root_stack,
    pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                       reason="qemu not installed (the vm backend installs it on first use)"),
    pytest.mark.skipif(not FSTESTS, reason="no fstests checkout: set POWERCUT_FSTESTS=DIR to a built one "
                       "(git clone of xfstests-dev, then `make fstests FSTESTS=DIR`)"),
]


@dataclass(frozen=True)
class Bug:
    kind: str
    workload: str
    fs: str
    mkfs_opts: str
    buggy: str
    fixed: str | None
    golden: str          # a line the golden .out must hold ("" for mount and fsck findings)


BUGS = [
    # generic/764: unfixed in every packaged Debian kernel (bookworm 6.1, 6.12)
    Bug("durability", "btrfs_fsync_unlinked.json", "btrfs", "", "debian:linux-image-6.12.117+deb12-amd64", None,
        "testdir/foo: absent"),
    # generic/788: fixed in 6.12.115 (upstream 5254d4181add)
    Bug("stale-data", "btrfs_truncate_fsync_link.json", "btrfs", "", "debian:linux-image-6.12.113+deb12-amd64",
        "debian:linux-image-6.12.115+deb12-amd64", "bytes 0..4096: (none)"),
    # ext4 fast_commit, powercut's own: seen on 6.1, 6.12 and 6.18
    Bug("fsck", "ext4_fast_commit_ftruncate_mkdir.json", "ext4", "-O fast_commit",
        "debian:linux-image-6.12.117+deb12-amd64", None, ""),
    Bug("mount", "ext4_fast_commit_unlink_open_fsync.json", "ext4", "-O fast_commit",
        "debian:linux-image-6.12.117+deb12-amd64", None, ""),
    # jbd2 WARNING: ea_inode xattr credits beyond the smallest journal (6.12)
    Bug("kernel", "ea_inode_xattr_warning.json", "ext4", "-b 1024 -O ea_inode -J size=1",
        "debian:linux-image-6.12.117+deb12-amd64", None, ""),
    # rename-atomic on ext4 without a journal: fsync of the old parent writes the name's removal,
    # not its addition (the configuration promises no metadata consistency: ./check's fsck is off)
    Bug("atomicity", "ext4_nojournal_rename_fsync_dir.json", "ext4", "-O ^has_journal",
        "debian:linux-image-6.12.117+deb12-amd64", None, "A/foo B/foo: one of 'absent file', 'file absent'"),
    # ext4 inline_data, powercut's own: a write after a grow by ftruncate (which converts the inline
    # file to a block) is lost; seen on 6.12 and 6.18
    Bug("durability", "ext4_inline_data_truncate_write.json", "ext4", "-O inline_data",
        "debian:linux-image-6.12.117+deb12-amd64", None, "f1 bytes 0..4096: 10x62 40x00 5x64 45x00"),
    # ext4 fast_commit, powercut's own: replay leaves i_blocks without the external xattr block;
    # seen on 6.12.117 and 7.2.13 (7.2's split kernel packages)
    Bug("fsck", "ext4_fast_commit_xattr_iblocks.json", "ext4", "-O fast_commit",
        "debian:linux-image-7.2.13+deb14-amd64", None, ""),
    # ext4 fast_commit, powercut's own: an O_TMPFILE file's first link is replayed before its inode
    # exists (unattached inode); the export's xfs_io -T run makes it; seen on 6.12.117 and 7.2.13
    Bug("fsck", "ext4_fast_commit_tmpfile_linkat.json", "ext4", "-O fast_commit",
        "debian:linux-image-7.2.13+deb14-amd64", None, ""),
    Bug("durability", "ext4_fast_commit_tmpfile_linkat.json", "ext4", "-O fast_commit",
        "debian:linux-image-7.2.13+deb14-amd64", None, "A/bar: file"),
]


def make_finding(tmp: Path, bug: Bug) -> Path:
    cfg = RunConfig.parse({"fs": bug.fs, "mkfs_opts": bug.mkfs_opts, "quiet": True, "backend": "vm",
                           "kernel": bug.buggy})
    doc = json.loads((WORKLOADS / bug.workload).read_text())
    trial = run_doc(doc, cfg, ownership.make_dir(str(tmp / "work")))
    sigs = [(s, f) for s, f in trial.signatures() if s.kind == bug.kind]
    assert sigs, f"{bug.workload} shows no {bug.kind} finding on {bug.buggy}: {trial.findings}"
    store = FindingStore(ownership.make_dir(str(tmp / "findings")))
    return Path(store.save(trial, *sigs[0], cfg, original=doc, also=[], shrink={"method": "none (given)", "runs": 0}))


def _id(bug: Bug) -> str:
    # a workload with two verified findings (kinds) is named by both
    twice = sum(b.workload == bug.workload for b in BUGS) > 1
    return bug.workload.removesuffix(".json") + (f"-{bug.kind}" if twice else "")


@pytest.mark.parametrize("bug", BUGS, ids=[_id(b) for b in BUGS])
def test_export_fails_in_real_fstests_on_the_buggy_kernel_and_passes_on_the_fixed(pc: PcEnv, bug: Bug) -> None:
    finding = make_finding(pc.tmp, bug)
    out = pc.tmp / "export"
    kernels = bug.buggy + (f",{bug.fixed}" if bug.fixed else "")
    p = pc.run("export", str(finding), "--format", "fstests", "--out", str(out), "--verify", kernels,
               "--fstests", FSTESTS)
    assert p.returncode == 1, p.stdout + p.stderr
    test, golden = (out / "generic-999").read_text(), (out / "generic-999.out").read_text()
    assert "powercut" not in test.split(". ./common/preamble")[1]   # no dependency past the header
    if bug.golden:
        assert bug.golden in golden and "Silence is golden" not in golden, golden
    else:
        assert golden.endswith("Silence is golden\n") and "_check_scratch_fs" in test
    assert "generic/999 failed, shell export REPRODUCED" in p.stdout, p.stdout
    if bug.fixed:
        assert "generic/999 passed, shell export not reproduced" in p.stdout, p.stdout
    assert "powercut export: verified" in p.stdout, p.stdout
    # ./check's own words on the buggy kernel
    log = out / f"verify-{bug.buggy.split('linux-image-')[1]}.txt"
    assert "Failures: generic/999" in log.read_text()


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["sigterm", "ctrl-c"])
def test_a_signal_during_verify_stops_the_guest_and_cleans_up(pc: PcEnv, sig: signal.Signals, code: int) -> None:
    """The guest (QEMU in its own session) dies with powercut, the checkout's copy goes with
    the run's scratch, and the exit status is the README's for the signal."""
    # A finding made on the host is enough: --verify boots the kernel it is given.
    cfg = RunConfig.parse({"fs": "ext4", "mkfs_opts": "-O fast_commit", "quiet": True})
    doc = json.loads((WORKLOADS / "ext4_fast_commit_ftruncate_mkdir.json").read_text())
    trial = run_doc(doc, cfg, ownership.make_dir(str(pc.tmp / "work")))
    store = FindingStore(ownership.make_dir(str(pc.tmp / "findings")))
    finding = store.save(trial, *trial.signatures()[0], cfg, original=doc, also=[],
                         shrink={"method": "none (given)", "runs": 0})
    proc = subprocess.Popen([*POWERCUT, "export", finding, "--format", "fstests", "--out", str(pc.tmp / "export"),
                             "--verify", "debian:linux-image-6.12.117+deb12-amd64", "--fstests", FSTESTS],
                            env=pc.env(), cwd=pc.tmp, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Wait until ./check runs in the guest: the guest's console output lands in the run's scratch.
    deadline = time.monotonic() + 1200
    while not any("== fstests: ./check" in p.read_text(errors="replace")
                  for p in pc.scratch.glob("*/guest-out/guest-command.out")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "./check never started in the guest"
        time.sleep(1)
    assert any("qemu" in x for x in pc.leftovers())
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert pc.leftovers() == [], err
    assert os.listdir(pc.state) == [] and os.listdir(pc.scratch) == [], err
