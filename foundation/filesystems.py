"""One table of what differs between file systems: mkfs, fsck, sizes, recovery.

Everything else in powercut is file-system agnostic and looks things up here.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field

from foundation import sysres, xfs_exchange
from foundation.errors import EnvError, UsageError


@dataclass(frozen=True)
class FsType:
    name: str
    mkfs: list[str]            # the device path is appended
    fsck: list[str]            # read-only check; the image path is appended
    fsck_package: str
    default_size_mib: int
    min_size_mib: int
    # Extra options for the recovery mount of a crash image: xfs refuses a
    # second mount of the same UUID, which parallel checking would hit.
    recovery_opts: list[str] = field(default_factory=list)
    # fsck output that says the checker could not look at the image at all (a probe of the
    # host's devices failed), not that the image is damaged: the check is run again.
    fsck_could_not_run: tuple[str, ...] = ()
    # Host tools the guest needs besides mkfs (xfs_db: foundation/xfs_exchange.py).
    guest_tools: tuple[str, ...] = ()

    def fsck_failed(self, code: int) -> bool:
        """Judge fsck by exit code only, never by its text (see block-recording.md)."""
        if self.name == "ext4":
            return bool(code & (4 | 8))  # 4: errors left, 8: operational error
        return code != 0

    def mkfs_cmd(self, dev: str, extra: str) -> list[str]:
        return self.mkfs + shlex.split(extra) + [dev]

    def make(self, target: str, extra: str) -> None:
        """mkfs on TARGET (a device or an image file); one clear EnvError if it fails."""
        by_hand = self.name == "xfs" and xfs_exchange.wanted(extra) and xfs_exchange.by_hand(self.mkfs[0])
        p = sysres.run(self.mkfs_cmd(target, xfs_exchange.strip(extra) if by_hand else extra),
                       check=False, timeout=600)
        if p.returncode == 0:
            if by_hand:
                xfs_exchange.set_bit(target, self.xfs_db())
            return
        last = (p.stderr or p.stdout).strip().splitlines()[-1:]
        hint = ""
        if any("check mount status" in line for line in last):
            # mkfs.btrfs looks at every mount's source; a loop device whose backing file sits on
            # a FUSE mount with no daemon (a killed run's recorder) answers ENOTCONN.
            hint = " (a mount on this machine sits on a dead FUSE mount or a gone device: `powercut cleanup` releases what killed powercut runs left)"
        raise EnvError(f"mkfs.{self.name} {extra} failed: {last}{hint}")

    def guest_mkfs(self, mkfs: str, extra: str) -> str:
        """The guest's mkfs command line (MKFS: the program's path there and its options)."""
        if self.name == "xfs" and xfs_exchange.wanted(extra) and xfs_exchange.by_hand(self.mkfs[0]):
            return xfs_exchange.guest_mkfs(mkfs, extra, self.xfs_db())
        return f"{mkfs} {extra}".strip()

    def fsck_cmd(self, image: str) -> list[str]:
        """FSCK on IMAGE, with the options that change how fast it runs, never what it checks."""
        return self.fsck + _fsck_speed_opts(self.name, image) + [image]

    def fsck_view(self, image: str) -> contextlib.AbstractContextManager[None]:
        """What IMAGE must look like to this fsck while it runs (xfs_exchange.py)."""
        if self.name != "xfs":
            return contextlib.nullcontext()
        return xfs_exchange.hidden_from_repair(image, self.fsck[0], self.xfs_db())

    def xfs_db(self) -> str:
        """The xfs_db of this tool set (the suite's under `--tools`), for the exchange-range bit."""
        return next((t for t in self.guest_tools if os.path.basename(t) == "xfs_db"), "xfs_db")

    def fsck_env(self) -> dict[str, str] | None:
        """The environment to run fsck_cmd in (None: ours), for the same reason as its options."""
        return _fsck_speed_env(self.name)


def _fsck_speed_opts(fs: str, image: str) -> list[str]:
    """xfs_repair's speed options: -o bhash=N sizes its buffer cache (8N buffers;
    xfs_repair(8)). Without it, xfs_repair sizes the cache to most of the machine's
    memory and sets up every hash bucket first, which on a small image costs about as
    much as the check itself. One bucket per 256 KiB of device, at least 1024, keeps
    the cache well above the image's metadata (xfs_repair itself goes down to 512 on
    machines short of memory). -o phase2_threads=1 (an option of xfs_repair.c, not in
    its man page; default 32) scans the AGs of phases 2, 3 and 7 in one thread instead
    of starting 32 per phase on a 2-core machine. Both change how the same checks are
    scheduled and cached, not which run: same exit code and same messages as plain
    `xfs_repair -n` on 700 damaged images and in tests/test_fsck_speed.py. (Not -P:
    with read-ahead off, xfs_repair 6.1 -n missed a directory block with a bad CRC
    that it reports with read-ahead on.)"""
    if fs != "xfs":
        return []
    try:
        size = os.stat(image).st_size
    except OSError:
        size = 0
    return ["-o", f"bhash={max(1024, size >> 18)},phase2_threads=1"]


# glibc's allocator (glibc.malloc tunables, ld.so(8) / the glibc manual's "Memory
# Allocation Tunables"): one arena for all threads instead of one created per thread,
# and large blocks from the heap, kept, instead of an mmap + page faults + munmap per
# allocation. xfs_repair starts ~50 threads and allocates its caches per run, so this
# is ~10% of its CPU and a third of its wall time here. Where memory comes from, not
# what the program computes: the same exit codes and messages on damaged images
# (tests/test_fsck_speed.py, and 300 more by hand, docs/exploration.md).
_XFS_REPAIR_TUNABLES = ("glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=1000000000:"
                        "glibc.malloc.trim_threshold=1000000000")


def _fsck_speed_env(fs: str) -> dict[str, str] | None:
    if fs != "xfs":
        return None
    mine = os.environ.get("GLIBC_TUNABLES")
    return {**os.environ, "GLIBC_TUNABLES": _XFS_REPAIR_TUNABLES + (f":{mine}" if mine else "")}


FILESYSTEMS: dict[str, FsType] = {
    # 4 KiB blocks: mkfs.ext4 otherwise picks 1 KiB for small images.
    "ext4": FsType("ext4", ["mkfs.ext4", "-q", "-F", "-b", "4096"], ["e2fsck", "-fn"],
                   "e2fsprogs", 64, 16),
    # Debian's xfsprogs refuses data devices under 300 MB.
    "xfs": FsType("xfs", ["mkfs.xfs", "-q", "-f"], ["xfs_repair", "-n", "-f"],
                  "xfsprogs", 300, 300, ["nouuid"], guest_tools=("xfs_db",)),
    # btrfs check first asks whether the image is mounted, probing the host's block devices;
    # a loop device detached meanwhile by another run makes that probe fail (ENXIO).
    "btrfs": FsType("btrfs", ["mkfs.btrfs", "-q", "-f"], ["btrfs", "check", "--readonly"],
                    "btrfs-progs", 128, 128, fsck_could_not_run=("could not check mount status",)),
    # mkfs.f2fs refuses devices under 64 MiB ("Device size is not sufficient") and
    # overprovisions a third of a 64 MiB one. fsck.f2fs -f checks the whole image
    # whatever its checkpoint flags say; --dry-run writes nothing (fsck.f2fs(8)).
    "f2fs": FsType("f2fs", ["mkfs.f2fs", "-q", "-f"], ["fsck.f2fs", "-f", "--dry-run"],
                   "f2fs-tools", 128, 64),
}


def get_fs(name: str) -> FsType:
    try:
        return FILESYSTEMS[name]
    except KeyError:
        raise UsageError(f"unknown --fs {name!r}: choose one of {', '.join(FILESYSTEMS)}") from None


def host_kernel_lacks(name: str) -> str:
    """Why this host's kernel cannot mount file system NAME ("" if it can, or if it cannot tell)."""
    try:
        with open("/proc/filesystems") as f:
            if any(line.split()[-1] == name for line in f if line.strip()):
                return ""
    except OSError:
        return ""
    # Not loaded yet: the first mount loads the module, if the kernel has one.
    if not shutil.which("modprobe"):
        return ""  # cannot tell: let the mount say
    probe = subprocess.run(["modprobe", "-n", name], capture_output=True, check=False)
    return "" if probe.returncode == 0 else f"the kernel has no {name} (not built in, no module)"


def join_opts(*parts: str | list[str]) -> str:
    """Join mount option strings/lists into one -o argument, dropping empties."""
    out: list[str] = []
    for p in parts:
        items = p if isinstance(p, list) else p.split(",")
        out += [i for i in items if i]
    return ",".join(out)
