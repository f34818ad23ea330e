"""What a guest kernel must be able to do, and which of its modules provide it.

A module name is an implementation detail that changes between kernel
versions (crc32c's crypto-API driver was crc32c_generic up to 6.13 and is
crc32c-cryptoapi since; FUSE and virtio-pci are built into some Debian
kernels and modules in others), so the guest asks for capabilities. Each one
names its CONFIG_ symbol and the module names that provide it across kernel
versions; a kernel's modules.builtin, modules.dep and .config decide whether
it is built in, a module to load, or missing. A missing one is one line
naming the capability (exit 2), never a boot that hangs later.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from foundation.errors import EnvError
from harness.backends.vm.kernel import Kernel


@dataclass(frozen=True)
class Capability:
    what: str                   # named in the error a kernel without it gets
    config: str | None          # the CONFIG_ symbol that builds it (None: not known here)
    modules: tuple[str, ...]    # module names providing it, across kernel versions


VIRTIO_PCI = Capability("virtio-pci (the guest's devices)", "CONFIG_VIRTIO_PCI", ("virtio_pci",))
VIRTIO_BLK = Capability("virtio-blk (the guest's disks)", "CONFIG_VIRTIO_BLK", ("virtio_blk",))
DM = Capability("device-mapper", "CONFIG_BLK_DEV_DM", ("dm_mod",))
DM_LOG_WRITES = Capability("dm-log-writes (the recorder)", "CONFIG_DM_LOG_WRITES", ("dm_log_writes",))
DM_FLAKEY = Capability("dm-flakey", "CONFIG_DM_FLAKEY", ("dm_flakey",))
FUSE = Capability("FUSE (the mark file)", "CONFIG_FUSE_FS", ("fuse",))
LOOP = Capability("loop devices", "CONFIG_BLK_DEV_LOOP", ("loop",))
NINEP = Capability("9p file system (the shared host root)", "CONFIG_9P_FS", ("9p",))
NINEP_VIRTIO = Capability("9p over virtio", "CONFIG_NET_9P_VIRTIO", ("9pnet_virtio",))
# The checksum a file system asks the crypto API for, by name, on kernels where it does (up to
# 6.14 ext4, jbd2, btrfs and libcrc32c did). The guest cannot modprobe on demand, so the driver is
# loaded up front; TCG's default CPU has no SSE4.2 for crc32c-intel. Since the library took
# over (7.x: CONFIG_CRC32=y) the module is still the crypto API's face of crc32c, and harmless.
CHECKSUMS = {
    "crc32c": Capability("crc32c checksums (crypto API)", "CONFIG_CRYPTO_CRC32C", ("crc32c_generic", "crc32c_cryptoapi")),
    "crc32": Capability("crc32 checksums (crypto API)", "CONFIG_CRYPTO_CRC32", ("crc32_generic", "crc32_cryptoapi")),
}
FS_CHECKSUM = {"f2fs": "crc32"}     # every other file system checksums with crc32c
# What the vm backend's guest needs besides the file systems.
GUEST = [VIRTIO_PCI, VIRTIO_BLK, DM, DM_LOG_WRITES, FUSE]


def for_fs(name: str) -> list[Capability]:
    """The checksum driver first: 6.x's libcrc32c (xfs) asks the crypto API for it when it loads."""
    return [CHECKSUMS[FS_CHECKSUM.get(name, "crc32c")],
            Capability(f"the {name} file system", f"CONFIG_{name.upper()}_FS", (name,))]


def module(name: str) -> Capability:
    """A capability that is one module by that name (`--modules dm_flakey` and the like)."""
    return Capability(f"module {name}", None, (name,))


def modules_for(kernel: Kernel, caps: Iterable[Capability]) -> list[str]:
    """The modules KERNEL must load for CAPS (built-in ones left out), in CAPS order; EnvError
    naming the first capability the kernel lacks."""
    out: list[str] = []
    for cap in dict.fromkeys(caps):
        state = _provider(kernel, cap)
        if state is not None and state not in out:
            out.append(state)
    return out


def _provider(kernel: Kernel, cap: Capability) -> str | None:
    """The module to load for CAP, None if built in."""
    if kernel.modules is None:
        return None  # a kernel given without modules: everything is built in, or it fails at boot
    for name in cap.modules:
        state = kernel.module_state(name)
        if state == "built in":
            return None
        if state == "module":
            return name
    value = "?" if cap.config is None else kernel.config_option(cap.config)
    if value == "y":
        return None  # built in without a modules.builtin line (a bool option)
    names = " or ".join(cap.modules)
    if value == "m":
        raise EnvError(f"kernel {kernel.label} lacks {cap.what}: {cap.config}=m but no module {names} in {kernel.modules}")
    if value is None:
        raise EnvError(f"kernel {kernel.label} lacks {cap.what}: {cap.config} is not set")
    raise EnvError(f"kernel {kernel.label} lacks {cap.what}: no module {names}, not built in")
