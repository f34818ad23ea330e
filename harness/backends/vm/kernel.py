"""The kernel under test: `--kernel debian:PACKAGE` or `--kernel PATH`.

A Debian kernel package is fetched with `apt-get download`, unpacked with
`dpkg-deb -x` (never installed), given a modules.dep with `depmod -b`, and
its uncompressed `vmlinux` is extracted from the bzImage so QEMU can boot it
directly through PVH (~3.4 s instead of ~6 s under TCG). All of that is
cached per package version in KERNEL_CACHE and reused by later runs.

A kernel given as PATH (vmlinux or bzImage) is booted as it is; its modules
come from `--kernel-modules DIR` (a lib/modules/VERSION directory that has a
modules.dep) unless everything needed is built in.
"""

from __future__ import annotations

import lzma
import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from dataclasses import dataclass

from foundation import paths, sysres
from foundation.errors import EnvError, UsageError

KERNEL_CACHE = os.path.join(paths.CACHE, "kernels")
DEBIAN_PREFIX = "debian:"
_PKG_NAME = re.compile(r"[a-z0-9][a-z0-9.+-]*")
_READY = ".ready"


@dataclass(frozen=True)
class Kernel:
    label: str               # as given on the command line
    image: str               # what QEMU boots: an ELF vmlinux (PVH) or a bzImage
    modules: str | None      # lib/modules/VERSION with modules.dep, None if all built in

    def module_order(self, names: list[str]) -> list[str]:
        """Paths (relative to `modules`) of NAMES and their dependencies, in load order.

        Built-in modules are skipped; a module that is neither built in nor
        present is an error naming the kernel.
        """
        if self.modules is None:
            return []
        deps = _read_modules_dep(self.modules)
        builtin = _read_builtin(self.modules)
        order: list[str] = []
        for name in names:
            key = _module_key(name)
            if key in builtin:
                continue
            if key not in deps:
                raise EnvError(f"kernel {self.label} has no module {name} (not built in, not in {self.modules})")
            path, requires = deps[key]
            # modules.dep lists dependencies so that loading them last-to-first works.
            for p in [*reversed(requires), path]:
                if p not in order:
                    order.append(p)
        return order


def resolve(spec: str, modules_dir: str | None = None) -> Kernel:
    if spec.startswith(DEBIAN_PREFIX):
        if modules_dir:
            raise UsageError("--kernel-modules goes with --kernel PATH; a debian: kernel brings its own modules")
        return debian_kernel(spec[len(DEBIAN_PREFIX):])
    return path_kernel(spec, modules_dir)


def path_kernel(path: str, modules_dir: str | None) -> Kernel:
    if not os.path.isfile(path):
        raise UsageError(f"--kernel {path}: no such file (want a vmlinux, a bzImage or debian:PACKAGE)")
    if modules_dir is not None and not os.path.isfile(os.path.join(modules_dir, "modules.dep")):
        raise UsageError(f"--kernel-modules {modules_dir}: no modules.dep there (run depmod, or give lib/modules/VERSION)")
    return Kernel(path, os.path.abspath(path), modules_dir and os.path.abspath(modules_dir))


# -- Debian packages ---------------------------------------------------------
def debian_kernel(name: str) -> Kernel:
    if not _PKG_NAME.fullmatch(name):
        raise UsageError(f"--kernel debian:{name}: not a Debian package name")
    pkg, version = _real_package(name)
    root = os.path.join(KERNEL_CACHE, f"{pkg}_{version}")
    if not os.path.exists(os.path.join(root, _READY)):
        _fetch(pkg, version, root)
    return _cached_kernel(f"debian:{name}", root)


def _apt_show(name: str) -> dict[str, str]:
    p = sysres.run(["apt-cache", "show", "--no-all-versions", name], check=False, timeout=60)
    if p.returncode != 0 or not p.stdout.strip():
        raise EnvError(f"--kernel debian:{name}: apt knows no such package (try `apt-get update`, or check the name with `apt-cache search linux-image`)")
    fields: dict[str, str] = {}
    for line in p.stdout.splitlines():
        if ":" in line and not line.startswith(" "):
            key, value = line.split(":", 1)
            fields[key] = value.strip()
    return fields


def _real_package(name: str) -> tuple[str, str]:
    """(package, version) of the kernel itself: meta packages such as
    linux-image-6.12-amd64 are followed to the linux-image-VERSION package they depend on."""
    for _ in range(4):
        info = _apt_show(name)
        deps = re.findall(r"(linux-image-[0-9][^\s,|()]*)", info.get("Depends", ""))
        if not deps:
            return name, info["Version"]
        name = deps[0]
    raise EnvError(f"--kernel debian:{name}: meta packages nest too deep")


def _fetch(pkg: str, version: str, root: str) -> None:
    os.makedirs(KERNEL_CACHE, exist_ok=True)
    # Build next to the final place and rename: a concurrent or killed run
    # never sees (or leaves) a half-unpacked kernel under the final name.
    tmp = tempfile.mkdtemp(prefix=f".{pkg}-", dir=KERNEL_CACHE)
    try:
        sysres.run(["apt-get", "download", "-q", f"{pkg}={version}"], timeout=900, cwd=tmp)
        deb = next(f for f in os.listdir(tmp) if f.endswith(".deb"))
        sysres.run(["dpkg-deb", "-x", os.path.join(tmp, deb), tmp], timeout=600)
        os.unlink(os.path.join(tmp, deb))
        base = _modules_base(tmp)
        release = _only_release(base)
        sysres.run(["depmod", "-b", base, release], timeout=600)
        extract_vmlinux(os.path.join(tmp, "boot", f"vmlinuz-{release}"), os.path.join(tmp, "vmlinux"))
        open(os.path.join(tmp, _READY), "w").close()
        try:
            os.rename(tmp, root)
        except OSError:
            if not os.path.exists(os.path.join(root, _READY)):  # lost a race: the winner's copy is used
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _modules_base(root: str) -> str:
    """The directory holding lib/modules: the package root, or root/usr in merged-/usr packages (trixie)."""
    return root if os.path.isdir(os.path.join(root, "lib", "modules")) else os.path.join(root, "usr")


def _only_release(base: str) -> str:
    releases = os.listdir(os.path.join(base, "lib", "modules"))
    if len(releases) != 1:
        raise EnvError(f"{base}: expected one lib/modules/VERSION, found {releases}")
    return releases[0]


def _cached_kernel(label: str, root: str) -> Kernel:
    base = _modules_base(root)
    release = _only_release(base)
    vmlinux = os.path.join(root, "vmlinux")
    image = vmlinux if os.path.exists(vmlinux) else os.path.join(root, "boot", f"vmlinuz-{release}")
    return Kernel(label, image, os.path.join(base, "lib", "modules", release))


# -- bzImage -> vmlinux --------------------------------------------------------
def extract_vmlinux(bzimage: str, out: str) -> None:
    """Write the ELF kernel inside BZIMAGE to OUT, if it can be booted via PVH (else nothing).

    Uses the bzImage header (Documentation/arch/x86/boot.rst): the protected-
    mode code starts after (setup_sects + 1) * 512 bytes; payload_offset and
    payload_length (at 0x248/0x24c) locate the compressed vmlinux in it.
    """
    with open(bzimage, "rb") as f:
        img = f.read()
    setup_sects = img[0x1F1] or 4
    payload_offset, payload_length = struct.unpack_from("<II", img, 0x248)
    start = (setup_sects + 1) * 512 + payload_offset
    payload = img[start:start + payload_length]
    config = bzimage.replace("vmlinuz-", "config-")  # Debian ships boot/config-VERSION beside it
    if not os.path.exists(config):
        return
    with open(config) as f:
        if "CONFIG_PVH=y\n" not in f.read():
            return
    elf = _decompress(payload)
    if elf is not None and elf.startswith(b"\x7fELF"):
        with open(out, "wb") as f:
            f.write(elf)


def _decompress(payload: bytes) -> bytes | None:
    if payload.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
    if payload.startswith(b"\x28\xb5\x2f\xfd"):
        # The kernel appends the uncompressed size after the frame; zstd
        # warns about trailing bytes but still writes the whole frame.
        p = subprocess.run(["zstd", "-dcq"], input=payload, capture_output=True)
        return p.stdout or None
    if payload.startswith(b"\x1f\x8b"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(payload)
    return None  # lz4/lzo/bzip2 kernels are booted as bzImage


# -- modules.dep ---------------------------------------------------------------
def _module_key(name: str) -> str:
    """dm-log-writes, dm_log_writes and kernel/.../dm-log-writes.ko.xz are one module."""
    base = os.path.basename(name).split(".ko")[0]
    return base.replace("-", "_")


def _read_modules_dep(modules: str) -> dict[str, tuple[str, list[str]]]:
    deps = {}
    with open(os.path.join(modules, "modules.dep")) as f:
        for line in f:
            path, _, rest = line.partition(":")
            deps[_module_key(path)] = (path, rest.split())
    return deps


def _read_builtin(modules: str) -> set[str]:
    try:
        with open(os.path.join(modules, "modules.builtin")) as f:
            return {_module_key(line.strip()) for line in f if line.strip()}
    except FileNotFoundError:
        return set()
