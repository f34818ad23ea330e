"""The kernel under test: `--kernel debian:PACKAGE` or `--kernel PATH`.

A Debian kernel package (`debian:PACKAGE` or `debian:PACKAGE/SUITE`, any
suite powercut's own apt configuration knows: harness/backends/debian.py)
is followed through meta packages to the versioned one, fetched with
`apt-get download` together with its linux-binary/-modules/-base parts when
it is split (sid's 7.x), unpacked with `dpkg-deb -x` (never installed),
given a modules.dep with `depmod -b`, and
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
from harness.backends import debian

KERNEL_CACHE = os.path.join(paths.CACHE, "kernels")
DEBIAN_PREFIX = "debian:"
_READY = ".ready"


@dataclass(frozen=True)
class Kernel:
    label: str               # as given on the command line
    image: str               # what QEMU boots: an ELF vmlinux (PVH) or a bzImage
    modules: str | None      # lib/modules/VERSION with modules.dep, None if all built in
    config: str | None = None  # the kernel's .config, if known

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

    def module_state(self, name: str) -> str | None:
        """"built in", "module" (in modules.dep) or None (neither) for module NAME."""
        if self.modules is None:
            return None
        key = _module_key(name)
        if key in _read_builtin(self.modules):
            return "built in"
        return "module" if key in _read_modules_dep(self.modules) else None

    def config_option(self, symbol: str) -> str | None:
        """The value of CONFIG symbol SYMBOL ("y", "m", ...), None if not set; "?" if no .config is known."""
        if self.config is None:
            return "?"
        return config_values(self.config).get(symbol)


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
    # A build tree's .config sits beside its vmlinux; an installed tree's as lib/modules/VERSION/config.
    configs = [os.path.join(os.path.dirname(path), ".config"), *([os.path.join(modules_dir, "config")] if modules_dir else [])]
    config = next((os.path.abspath(c) for c in configs if os.path.isfile(c)), None)
    return Kernel(path, os.path.abspath(path), modules_dir and os.path.abspath(modules_dir), config)


# -- Debian packages ---------------------------------------------------------
_SPEC = re.compile(r"([a-z0-9][a-z0-9.+-]*)(?:/([a-z][a-z-]*))?")   # PACKAGE or PACKAGE/SUITE
# The parts of a split kernel package (sid's 7.x): linux-image-R depends on these, version-pinned.
_PARTS = ("binary", "modules", "base")


def debian_kernel(spec: str) -> Kernel:
    m = _SPEC.fullmatch(spec)
    if m is None:
        raise UsageError(f"--kernel debian:{spec}: not a Debian package name (PACKAGE or PACKAGE/SUITE)")
    name, suite = m[1], m[2]
    if suite is not None and suite not in debian.SUITE_NAMES:
        raise UsageError(f"--kernel debian:{spec}: powercut knows the suites {', '.join(debian.SUITE_NAMES)}")
    image, parts = kernel_packages(spec, name, suite)
    root = os.path.join(KERNEL_CACHE, f"{image.name}_{image.version}")
    if not os.path.exists(os.path.join(root, _READY)):
        _fetch(image.name, parts, root)
    return _cached_kernel(f"debian:{spec}", root)


def _depends(text: str) -> list[tuple[str, str | None]]:
    """(name, pinned version or None) of each Depends entry (an alternative's first choice)."""
    out = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        m = re.match(r"([^\s(|]+)\s*(?:\(\s*=\s*([^)\s]+)\s*\))?", entry.split("|")[0].strip())
        if m:
            out.append((m[1], m[2]))
    return out


def kernel_packages(spec: str, name: str, suite: str | None) -> tuple[debian.Candidate, list[debian.Candidate]]:
    """The versioned kernel package NAME leads to (meta packages such as linux-image-amd64 or
    linux-image-6.12-amd64 are followed) and every package its files are in: itself, or
    itself and its linux-binary/-modules/-base parts."""
    pkg = debian.find(name, suite)
    if pkg is None:
        where = suite or ", ".join(debian.SUITE_NAMES)
        raise EnvError(f"--kernel debian:{spec}: no package {name} in any suite searched ({where})")
    for _ in range(4):
        deps = _depends(debian.show(pkg).get("Depends", ""))
        nested = [(n, v) for n, v in deps if re.fullmatch(r"linux-image-[0-9].*", n)]
        if nested:  # a meta package: the kernel it pins
            n, v = nested[0]
            nxt = debian.find(n, None if v else suite, v)
            if nxt is None:
                raise EnvError(f"--kernel debian:{spec}: {pkg.name} {pkg.version} needs {n} {v or ''}, which no suite has")
            pkg = nxt
            continue
        release = pkg.name.removeprefix("linux-image-")
        parts = [pkg]
        for n, v in deps:
            if v and n in {f"linux-{p}-{release}" for p in _PARTS}:
                part = debian.find(n, version=v)
                if part is None:
                    raise EnvError(f"--kernel debian:{spec}: {pkg.name} needs {n} {v}, which no suite has")
                parts.append(part)
        return pkg, parts
    raise EnvError(f"--kernel debian:{spec}: meta packages nest too deep")


def _fetch(name: str, pkgs: list[debian.Candidate], root: str) -> None:
    os.makedirs(KERNEL_CACHE, exist_ok=True)
    # Build next to the final place and rename: a concurrent or killed run
    # never sees (or leaves) a half-unpacked kernel under the final name.
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=KERNEL_CACHE)
    try:
        debian.unpack(pkgs, tmp)
        base = _modules_base(tmp)
        release = _only_release(base)
        sysres.run(["depmod", "-b", base, release], timeout=600)
        image, config = _kernel_files(tmp, release)
        if config is not None:
            extract_vmlinux(image, os.path.join(tmp, "vmlinux"), config)
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


def _kernel_files(root: str, release: str) -> tuple[str, str | None]:
    """(bzImage, config) of an unpacked package: boot/vmlinuz-R and boot/config-R (one
    linux-image package), or lib/modules/R/vmlinuz and .../config (the split packages)."""
    mods = os.path.join(_modules_base(root), "lib", "modules", release)
    image = next((p for p in (os.path.join(root, "boot", f"vmlinuz-{release}"), os.path.join(mods, "vmlinuz"))
                  if os.path.exists(p)), None)
    if image is None:
        raise EnvError(f"{root}: no boot/vmlinuz-{release} nor lib/modules/{release}/vmlinuz in the kernel package")
    config = next((p for p in (os.path.join(root, "boot", f"config-{release}"), os.path.join(mods, "config"))
                   if os.path.exists(p)), None)
    return image, config


def _cached_kernel(label: str, root: str) -> Kernel:
    base = _modules_base(root)
    release = _only_release(base)
    vmlinux = os.path.join(root, "vmlinux")
    image, config = _kernel_files(root, release)
    return Kernel(label, vmlinux if os.path.exists(vmlinux) else image,
                  os.path.join(base, "lib", "modules", release), config)


# -- bzImage -> vmlinux --------------------------------------------------------
def extract_vmlinux(bzimage: str, out: str, config: str) -> None:
    """Write the ELF kernel inside BZIMAGE to OUT, if it can be booted via PVH (CONFIG: the kernel's
    .config says so; else nothing is written).

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
    if config_values(config).get("CONFIG_PVH") != "y":
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


def config_values(config: str) -> dict[str, str]:
    """CONFIG_X -> "y", "m" or a value, from a kernel .config (options not set are absent)."""
    out = {}
    with open(config) as f:
        for line in f:
            key, sep, value = line.strip().partition("=")
            if sep and key.startswith("CONFIG_"):
                out[key] = value
    return out


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
