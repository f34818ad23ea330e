"""Run a command inside a guest kernel that sees this host's files: powercut itself, in a VM.

The guest boots the kernel under test with a small initramfs (busybox, the
modules, harness/backends/vm/guest/hostroot.sh), mounts the host's / read-only
over virtio 9p and chroots into it, so the host's Python, venv, C programs and
mkfs tools run unchanged against the guest kernel (its device-mapper, loop
devices, file systems). /tmp, /run and /dev/shm are tmpfs in the guest (the
state and scratch directories live there: user xattrs on tmpfs need a 6.6+
guest kernel); one host directory is shared writable for results. This is how
the `dm` backend is tested on a host without device-mapper (tests/test_dm_guest.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from harness.backends.vm import capabilities, cpio, initramfs
from harness.backends.vm.kernel import Kernel
from harness.backends.vm.qemu import Guest, Share
from foundation import paths
from foundation.errors import EnvError
from foundation.runstate import RunState

# Besides the vm backend's own modules: 9p for the shared root, loop for
# powercut's devices, the file systems.
HOSTROOT_CAPABILITIES = [capabilities.NINEP, capabilities.NINEP_VIRTIO, capabilities.LOOP]
HOSTROOT_FILESYSTEMS = ["ext4", "xfs", "btrfs"]
MEMORY_MIB = 2048  # tmpfs holds every image and log of the runs
# The host's programs may use any instruction this CPU has (pyenv builds
# Python with -march=native): QEMU's default model lacks many, `max` has all it can emulate.
CPU = "max"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class HostRootResult:
    exit_code: int
    kernel: str          # the guest's uname -r
    seconds: float       # the whole boot
    output: str          # the command's stdout and stderr


def initrd(kernel: Kernel, modules: list[str] | None = None) -> str:
    tree = initramfs.Tree()
    for d in ["dev", "proc", "sys", "run", "tmp", "mnt", "bin", "sbin"]:
        tree.add(cpio.directory(d))
    tree.add_program(initramfs.BUSYBOX, "bin/busybox")
    tree.add(cpio.symlink("bin/sh", "busybox"))
    for at, name in {"init": "init.sh", "pc/hostroot.sh": "hostroot.sh"}.items():
        tree.add_host_file(os.path.join(initramfs.GUEST_DIR, name), at, executable=True)
    more = [*HOSTROOT_CAPABILITIES, *(capabilities.module(m) for m in modules or [])]
    initramfs.add_modules(tree, kernel, initramfs.guest_modules(kernel, HOSTROOT_FILESYSTEMS, more))
    return initramfs.cached(tree)


def run_in_guest(kernel: Kernel, command: str, out_dir: str, state: RunState, *, timeout: float,
                 modules: list[str] | None = None) -> HostRootResult:
    """Boot KERNEL once and run COMMAND (sh -c, as root) in the host's root; OUT_DIR is writable there.
    MODULES: more of the guest kernel's modules to load (dm_flakey, ...)."""
    if not os.path.exists(initramfs.BUSYBOX):
        raise EnvError(f"{initramfs.BUSYBOX} is missing: install busybox-static")
    out_dir = os.path.abspath(out_dir)
    guest = Guest(kernel, initrd(kernel, modules), state, out_dir, memory_mib=MEMORY_MIB, cpu=CPU)
    output = os.path.join(out_dir, "guest-command.out")
    # The project itself is shared once more at its own path: a checkout under
    # /tmp (a fresh clone in CI) would be hidden by the guest's tmpfs there.
    env = {"PC_COMMAND": command, "PC_OUT": out_dir, "PC_ROOT": paths.ROOT, "PC_PATH": PATH}
    shares = [Share("hostroot", "/"), Share("pcroot", paths.ROOT), Share("pcout", out_dir, readonly=False)]
    outcome = guest.boot("hostroot", env, [], timeout=timeout, output=output, shares=shares)
    with open(output, errors="replace") as f:
        text = f.read()
    codes = [line.split()[1] for line in outcome.lines if line.startswith("exit ")]
    if not outcome.completed or not codes:
        raise EnvError(f"the guest stopped before the command finished: last console line: {outcome.console_tail}")
    return HostRootResult(int(codes[0]), outcome.kernel, guest.boots[-1], text)
