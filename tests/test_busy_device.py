"""A busy device is never a finding; a file system's refusal is, with the kernel's words.

Real loop devices, a real ext4 image and the real kernel: another process
claims the loop device (an exclusive open, as mkfs, another mount or a
probing tool would) while the recovery mount comes, so the kernel answers
EBUSY ("Can't open blockdev") on purpose.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checkers.crashwalk.walk import verdict_findings
from checkers.crashwalk.recovery import mount_for_recovery, recover_and_check
from foundation import kmount, ownership
from foundation.errors import EnvError
from foundation.filesystems import get_fs
from foundation.loopdev import LoopDevice
from replay.crashstates import CrashState
from common import require_root

pytestmark = require_root
EXT4 = get_fs("ext4")
HOLD = "import os, sys; os.open(sys.argv[1], os.O_RDONLY | os.O_EXCL); print('held', flush=True); sys.stdin.read()"


@pytest.fixture
def loop(tmp_path: Path):
    img = str(tmp_path / "fs.img")
    os.close(ownership.create_file(img, 32 << 20))
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", img], check=True, capture_output=True)
    dev = LoopDevice(img)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    yield dev, str(mnt)
    kmount.umount(str(mnt))
    dev.close()


def hold(dev: str) -> subprocess.Popen[str]:
    """Another process that claims DEV (exclusive open) until its stdin closes."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, dev], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "held\n"
    return p


def release(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=30)


def test_a_busy_device_is_waited_for_and_logged_not_a_finding(loop) -> None:
    dev, mnt = loop
    holder = hold(dev.path)
    seen = []

    def on_wait(w: dict) -> None:  # the wait has begun: now let the holder go
        seen.append(dict(w))
        release(holder)

    try:
        v = mount_for_recovery(dev, EXT4, "", mnt, on_wait=on_wait)
    finally:
        release(holder)
    assert v is not None and v.mount_ok, v
    assert len(seen) == 1 and seen[0]["errno"] == "EBUSY"
    # the evidence names what held the device
    assert f"{holder.pid} python" in seen[0]["held_by"], seen[0]["held_by"]
    # one wait, recorded whole: begun (on_wait saw it) and ended (it carries how long it took)
    assert len(v.device_waits) == 1 and isinstance(v.device_waits[0]["waited_s"], float)
    assert "waited_s" not in seen[0]
    assert os.path.ismount(mnt)


def test_a_device_that_stays_busy_is_an_environment_error(loop) -> None:
    dev, mnt = loop
    holder = hold(dev.path)
    try:
        with pytest.raises(EnvError) as e:
            mount_for_recovery(dev, EXT4, "", mnt, wait_s=0.5)
    finally:
        release(holder)
    msg = str(e.value)
    assert "EBUSY" in msg and "not a finding" in msg and f"{holder.pid} python" in msg, msg
    assert not os.path.ismount(mnt)


def test_a_refusal_by_the_file_system_is_a_mount_finding_with_the_kernel_log(loop) -> None:
    """Group descriptors overwritten: ext4 refuses the mount itself and says why in the kernel log."""
    dev, mnt = loop
    with open(dev.backing, "r+b") as f:
        f.seek(4096)  # the group descriptor table of a 4 KiB-block ext4
        f.write(b"\xff" * 64)
    dev.drop_caches()
    v = recover_and_check(dev, EXT4, "", mnt)
    assert not v.mount_ok and v.mount_errno != "EBUSY" and not v.device_waits
    assert errno.errorcode[getattr(errno, v.mount_errno)] == v.mount_errno
    name = os.path.basename(dev.path)
    assert any(f"({name})" in line for line in v.kernel_log), v.kernel_log
    state = CrashState(id="p3", point=3, mode="prefix", epoch_start=3, epoch=(), mark=None, mark_index=None)
    [finding] = verdict_findings(v, state, EXT4)
    assert finding.kind == "mount" and finding.evidence["kernel_log"] == v.kernel_log
    assert finding.evidence["errno"] == v.mount_errno and "kernel:" in finding.detail


def test_the_read_only_content_mount_waits_for_a_busy_device_too(loop, tmp_path: Path) -> None:
    """The vm backend mounts each guest-recovered image read-only on the host for the content
    checks: a device another process claims there is waited for, not a `mount` finding (seen
    once with three campaigns at once)."""
    from checkers.crashwalk.recovery import inspect_on_loop
    from foundation.runstate import RunState
    dev, mnt = loop
    state = RunState(str(tmp_path))
    read: list[str] = []
    holder = hold(dev.path)
    try:
        found, waits = inspect_on_loop(dev, EXT4, mnt, state, lambda m: read.append(m) or [],
                                       on_wait=lambda w: release(holder))
    finally:
        release(holder)
    assert found == [] and read == [mnt]
    # The wait is evidence for the run's report (device_waits), as a recovery mount's is.
    assert [w["errno"] for w in waits] == ["EBUSY"] and waits[0]["waited_s"] >= 0
    holder = hold(dev.path)
    try:
        with pytest.raises(EnvError, match="not a finding"):
            inspect_on_loop(dev, EXT4, mnt, state, lambda m: [], wait_s=0.5)
    finally:
        release(holder)
