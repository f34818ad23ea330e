"""Debian's kernels from every suite: powercut's own apt lists, both package layouts, capabilities.

The guest boots are one per layout the older tests do not cover: sid's split
packages (linux-image-R depends on linux-binary/-modules/-base-R) and
trixie's merged-/usr single package. bookworm's layout boots in
tests/test_vm_backend.py. The kernels are named through suite-pinned meta
packages, so the tests follow the archive as sid moves on.
"""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from foundation.errors import EnvError
from harness.backends import debian
from harness.backends.vm import initramfs
from harness.backends.vm.kernel import Kernel, kernel_packages, resolve
from common import WORKLOADS, require_root
from conftest import PcEnv

SID = "debian:linux-image-amd64/sid"
TRIXIE = "debian:linux-image-amd64/trixie"


# -- versions: dpkg is the oracle ------------------------------------------------------
def dpkg_cmp(a: str, b: str) -> int:
    if subprocess.run(["dpkg", "--compare-versions", a, "lt", b]).returncode == 0:
        return -1
    return 0 if subprocess.run(["dpkg", "--compare-versions", a, "eq", b]).returncode == 0 else 1


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="needs dpkg (the reference ordering)")
def test_version_order_is_dpkgs() -> None:
    versions = ["6.12.117-1~deb12u1", "6.12.117-1", "6.12.118-1", "7.2.13-1", "7.3~rc7-1~exp1", "7.3-1",
                "6.1.192-3", "6.1.192-2", "6.12.95-1~bpo12+1", "1:0.1-1", "6.12.9-1", "1.0a-1", "1.0-1",
                "1.0+b1", "1.0~~-1", "1.0~-1", "1.0", "1.0-0", "2.0.0001", "2.0.1"]
    for a in versions:
        for b in versions:
            got = debian.compare_versions(a, b)
            assert (got > 0) - (got < 0) == dpkg_cmp(a, b), (a, b)


def test_depends_parser_keeps_pins_and_first_alternatives() -> None:
    from harness.backends.vm.kernel import _depends
    assert _depends("dracut | initramfs-tools (>= 0.120+deb8u2), linux-base-7.2.13+deb14-amd64 (= 7.2.13-1), kmod") == [
        ("dracut", None), ("linux-base-7.2.13+deb14-amd64", "7.2.13-1"), ("kmod", None)]


# -- capabilities on a kernel tree made here ------------------------------------------
def modules_tree(tmp_path: Path, config: str) -> Path:
    d = tmp_path / "lib/modules/7.99.0"
    d.mkdir(parents=True)
    (d / "modules.dep").write_text(
        "kernel/drivers/block/virtio_blk.ko.xz:\n"
        "kernel/drivers/md/dm-mod.ko.xz:\n"
        "kernel/fs/ext4/ext4.ko.xz: kernel/fs/jbd2/jbd2.ko.xz\n"
        "kernel/fs/jbd2/jbd2.ko.xz:\n"
        "kernel/crypto/crc32c-cryptoapi.ko.xz:\n")
    (d / "modules.builtin").write_text("kernel/drivers/virtio/virtio_pci.ko\nkernel/fs/fuse/fuse.ko\n")
    (d / "config").write_text(config)
    return d


CONFIG = ("CONFIG_VIRTIO_PCI=y\nCONFIG_VIRTIO_BLK=m\nCONFIG_BLK_DEV_DM=m\n"
          "CONFIG_FUSE_FS=y\nCONFIG_EXT4_FS=m\nCONFIG_CRYPTO_CRC32C=m\n")


def test_capabilities_pick_what_the_kernel_has(tmp_path: Path) -> None:
    d = modules_tree(tmp_path, CONFIG + "CONFIG_DM_LOG_WRITES=y\n")
    k = Kernel("test", "/vmlinux", str(d), str(d / "config"))
    # dm-log-writes: built in by .config alone (no modules.builtin line); crc32c by its 7.x name.
    assert initramfs.guest_modules(k, ["ext4"]) == ["virtio_blk", "dm_mod", "crc32c_cryptoapi", "ext4"]


@pytest.mark.parametrize("config,message", [
    (CONFIG, "lacks dm-log-writes (the recorder): CONFIG_DM_LOG_WRITES is not set"),
    (CONFIG + "CONFIG_DM_LOG_WRITES=m\n", "CONFIG_DM_LOG_WRITES=m but no module dm_log_writes in"),
])
def test_a_missing_capability_is_named(tmp_path: Path, config: str, message: str) -> None:
    d = modules_tree(tmp_path, config)
    with pytest.raises(EnvError, match=re.escape(message)):
        initramfs.guest_modules(Kernel("test", "/vmlinux", str(d), str(d / "config")), ["ext4"])


@require_root
def test_a_kernel_path_lacking_a_capability_is_one_line_exit_2(pc: PcEnv, tmp_path: Path) -> None:
    """Through the CLI: --kernel PATH --kernel-modules DIR whose .config has no dm-log-writes."""
    d = modules_tree(tmp_path, CONFIG)
    image = tmp_path / "vmlinux"
    image.write_bytes(b"\0" * 4096)
    p = pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--backend", "vm", "--kernel", str(image),
               "--kernel-modules", str(d), "--out", str(tmp_path / "out"), check_rc=2)
    lines = p.stderr.strip().splitlines()
    assert lines == [f"powercut: kernel {image} lacks dm-log-writes (the recorder): CONFIG_DM_LOG_WRITES is not set"], p.stderr


# -- real Debian kernels: one boot per layout --------------------------------------------
def boot_mixed(pc: PcEnv, spec: str) -> dict:
    out = pc.tmp / "out"
    pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--backend", "vm", "--kernel", spec,
           "--out", str(out), check_rc=0)
    return json.loads((out / "report.json").read_text())


@pytest.mark.e2e
@pytest.mark.vm
@require_root
def test_sids_split_kernel_boots_and_runs(pc: PcEnv) -> None:
    image, parts = kernel_packages(SID, "linux-image-amd64", "sid")
    release = image.name.removeprefix("linux-image-")
    assert {p.name for p in parts} >= {f"linux-{k}-{release}" for k in ("binary", "modules", "base")}, parts
    k = resolve(SID)
    assert k.modules and os.path.exists(os.path.join(k.modules, "modules.dep"))  # made by depmod
    r = boot_mixed(pc, SID)
    assert r["kernel"] == release and r["findings"] == []


@pytest.mark.e2e
@pytest.mark.vm
@require_root
def test_trixies_kernel_boots_and_runs(pc: PcEnv) -> None:
    image, parts = kernel_packages(TRIXIE, "linux-image-amd64", "trixie")
    assert [p.name for p in parts] == [image.name] and image.suite == "trixie"  # one package
    r = boot_mixed(pc, TRIXIE)
    assert r["kernel"] == image.name.removeprefix("linux-image-") and r["findings"] == []


def test_unknown_suite_is_refused() -> None:
    from foundation.errors import UsageError
    with pytest.raises(UsageError, match="powercut knows the suites bookworm, "):
        resolve("debian:linux-image-amd64/hamm")


def test_suites_are_in_powercuts_own_sources() -> None:
    text = debian.sources_text()
    for suite in debian.SUITE_NAMES:
        assert f" {suite} main\n" in text
    assert all(o.split("=", 1)[1].startswith(debian.APT_DIR) for o in debian.apt_options()
               if o.startswith(("Dir::Etc::source", "Dir::State::Lists", "Dir::Cache")))


# -- --tools debian:SUITE ------------------------------------------------------------------
@require_root
def test_a_suites_fsck_runs_on_the_host_with_its_own_c_library() -> None:
    from foundation.filesystems import get_fs
    from harness.backends import tools
    sid = debian.find("e2fsprogs", "sid")
    assert sid is not None
    fs = tools.for_fs("debian:sid", get_fs("ext4"))
    p = subprocess.run([fs.fsck[0], "-V"], capture_output=True, text=True)
    assert p.returncode == 0 and f"e2fsck {sid.version.split('-')[0]}" in p.stderr, p.stderr


@require_root
def test_an_unknown_tools_suite_is_one_line_exit_2(pc: PcEnv) -> None:
    p = pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--tools", "debian:hamm",
               "--out", str(pc.tmp / "out"), check_rc=2)
    assert p.stderr.strip().splitlines() == [
        f"powercut: --tools debian:hamm: give debian:SUITE, a suite of {', '.join(debian.SUITE_NAMES)} (or host)"]


@pytest.mark.e2e
@pytest.mark.vm
@require_root
def test_sids_tools_make_the_file_system_in_the_guest_and_check_it_on_the_host(pc: PcEnv) -> None:
    """The guest carries only the suite's mke2fs (through its wrapper): a clean run proves it ran;
    report.json names sid's versions, as apt has them."""
    out = pc.tmp / "out"
    pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--backend", "vm", "--kernel", SID,
           "--tools", "debian:sid", "--out", str(out), check_rc=0)
    r = json.loads((out / "report.json").read_text())
    sid = debian.find("e2fsprogs", "sid")
    assert sid is not None and r["tools"]["from"] == "debian:sid"
    assert r["tools"]["packages"]["e2fsprogs"] == sid.version and "libc6" in r["tools"]["packages"]
    assert r["findings"] == [] and r["crash_states_checked"] > 0


@require_root
def test_a_suites_xfsprogs_makes_and_checks_exchange_range_itself(tmp_path: Path) -> None:
    """sid's xfsprogs knows `-i exchange=1`: the by-hand bit (foundation/xfs_exchange.py,
    for the host's older xfsprogs) must stay out of its way. It used to look at the
    host's versions, set the bit on the primary superblock only around sid's xfs_repair,
    and every crash state of an xfs `--tools debian:sid` run was an fsck finding
    ("incompat feature mismatch in AG 1 super")."""
    from foundation import xfs_exchange
    from foundation.filesystems import get_fs
    from harness.backends import tools
    fs = tools.for_fs("debian:sid", get_fs("xfs"))
    image = tmp_path / "xfs.img"
    with open(image, "wb") as f:
        f.truncate(300 << 20)
    fs.make(str(image), "-i exchange=1")
    db = fs.xfs_db()
    assert db != "xfs_db" and not xfs_exchange.by_hand(fs.mkfs[0])
    for ag in ("0", "1"):
        p = subprocess.run([db, "-r", "-c", f"sb {ag}", "-c", "p features_incompat", str(image)],
                           capture_output=True, text=True, check=True)
        assert int(p.stdout.split("=")[1], 16) & xfs_exchange.EXCHRANGE, (ag, p.stdout)
    with fs.fsck_view(str(image)):
        p = subprocess.run(fs.fsck_cmd(str(image)), capture_output=True, text=True)
    assert p.returncode == 0 and "feature mismatch" not in p.stdout + p.stderr, p.stdout + p.stderr
