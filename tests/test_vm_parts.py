"""Pieces of the vm backend that need no guest boot: archives, modules, packages, batches."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.errors import EnvError
from harness.sparse import copy_range, data_extents
from harness.vm import cpio, packages
from harness.vm.kernel import Kernel


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
