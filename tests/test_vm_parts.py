"""Pieces of the vm backend that need no guest boot: archives, modules, packages, batches."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.backends.vm.recovery import VmRecovery
from harness.foundation.errors import EnvError
from harness.foundation.filesystems import get_fs
from harness.foundation.sparse import copy_range, data_extents
from harness.backends.vm import cpio, packages
from harness.backends.vm.kernel import Kernel
from harness.backends.vm.qemu import Disk, Outcome


def test_cpio_archive_unpacks_with_busybox(tmp_path: Path) -> None:
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        pytest.skip("no busybox to unpack with")
    members = [cpio.directory("a"), cpio.file("a/x.sh", b"echo hi\n", executable=True),
               cpio.file("a/odd", b"12345"), cpio.symlink("a/link", "x.sh")]
    (tmp_path / "in.cpio").write_bytes(cpio.archive(members))
    subprocess.run([busybox, "cpio", "-i", "-F", str(tmp_path / "in.cpio")], cwd=tmp_path, check=True,
                   capture_output=True)
    assert (tmp_path / "a/x.sh").read_bytes() == b"echo hi\n" and os.access(tmp_path / "a/x.sh", os.X_OK)
    assert (tmp_path / "a/odd").read_bytes() == b"12345"
    assert os.readlink(tmp_path / "a/link") == "x.sh"
    assert cpio.gzipped(members) == cpio.gzipped(members)  # deterministic: cache keys stay stable


def fake_modules(tmp_path: Path) -> str:
    d = tmp_path / "lib/modules/6.99.0"
    d.mkdir(parents=True)
    (d / "modules.dep").write_text(
        "kernel/fs/ext4/ext4.ko.xz: kernel/lib/crc16.ko.xz kernel/fs/jbd2/jbd2.ko.xz\n"
        "kernel/fs/jbd2/jbd2.ko.xz:\n"
        "kernel/lib/crc16.ko.xz:\n"
        "kernel/drivers/md/dm-log-writes.ko.xz: kernel/drivers/md/dm-mod.ko.xz\n"
        "kernel/drivers/md/dm-mod.ko.xz:\n")
    (d / "modules.builtin").write_text("kernel/drivers/virtio/virtio_pci.ko\n")
    return str(d)


def test_module_order_loads_dependencies_first_and_skips_builtins(tmp_path: Path) -> None:
    k = Kernel("test", "/vmlinux", fake_modules(tmp_path))
    assert k.module_order(["virtio_pci", "dm-log-writes", "dm_mod", "ext4"]) == [
        "kernel/drivers/md/dm-mod.ko.xz", "kernel/drivers/md/dm-log-writes.ko.xz",
        "kernel/fs/jbd2/jbd2.ko.xz", "kernel/lib/crc16.ko.xz", "kernel/fs/ext4/ext4.ko.xz"]


def test_missing_module_names_the_kernel(tmp_path: Path) -> None:
    k = Kernel("debian:linux-image-test", "/vmlinux", fake_modules(tmp_path))
    with pytest.raises(EnvError, match="kernel debian:linux-image-test has no module xfs"):
        k.module_order(["xfs"])


def test_missing_packages_without_root_name_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(EnvError, match=r"--backend vm needs the Debian packages qemu-system-x86: "
                                       r"install them \(apt-get install qemu-system-x86\)"):
        packages.ensure({"/nonexistent/qemu-system-x86_64": "qemu-system-x86"}, "--backend vm")


def test_copy_range_moves_only_data_to_an_offset(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    with open(src, "wb") as f:
        f.truncate(1 << 20)
        f.seek(4096)
        f.write(b"A" * 4096)
        f.seek(512 << 10)
        f.write(b"B" * 8192)
    with open(src, "rb") as s, open(dst, "wb+") as d:
        copy_range(s.fileno(), d.fileno(), 0, 1 << 20, 3 << 20)
        d.truncate(4 << 20)
        d.seek((3 << 20) + 4096)
        assert d.read(4096) == b"A" * 4096
        d.seek((3 << 20) + (512 << 10))
        assert d.read(8192) == b"B" * 8192
        # Holes stayed holes: only the two data regions were written.
        written = sum(n for _, n in data_extents(d.fileno(), 4 << 20))
        assert written <= 64 << 10


class FakeGuest:
    """Plays back scripted guest outcomes and remembers each boot's environment."""

    def __init__(self, outcomes: list[Outcome]) -> None:
        self.outcomes = outcomes
        self.envs: list[dict[str, str]] = []

    def boot(self, job: str, env: dict[str, str], disks: list[Disk], *, timeout: float) -> Outcome:
        assert job == "recover" and len(disks) == 1
        self.envs.append(env)
        return self.outcomes.pop(0)


def test_vm_recovery_batch_survives_a_guest_that_dies_mid_mount(tmp_path: Path) -> None:
    image = tmp_path / "crash.img"
    with open(image, "wb") as f:
        f.truncate(16 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    guest = FakeGuest([
        # Boot 1 recovers image 0, then the kernel panics mounting image 1.
        Outcome("6.99", ["begin 0", "ok 0", "begin 1"], completed=False, console_tail="Kernel panic - not syncing"),
        # Boot 2 starts after the image that killed the kernel.
        Outcome("6.99", ["begin 2", "fail 2 mount: Structure needs cleaning"], completed=True, console_tail=""),
    ])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    engine = VmRecovery(guest, get_fs("ext4"), "", SimpleNamespace(scratch=str(scratch)), timeout=60)  # type: ignore[arg-type]
    try:
        assert engine.submit(10, str(image)) == [] and engine.submit(11, str(image)) == []
        assert engine.submit(12, str(image)) == []
        verdicts = dict(engine.finish())
    finally:
        engine.close()
    assert [e["PC_FIRST"] for e in guest.envs] == ["0", "2"] and guest.envs[0]["PC_IMAGES"] == "3"
    assert verdicts[10].mount_ok and verdicts[10].fsck_ran and not verdicts[10].fsck_failed
    assert not verdicts[11].mount_ok and "died mounting this image: Kernel panic" in verdicts[11].mount_error
    assert not verdicts[12].mount_ok and verdicts[12].mount_error == "mount: Structure needs cleaning"
