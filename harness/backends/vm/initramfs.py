"""The guest's initramfs: busybox, host programs with their libraries, modules, scripts.

Generic on purpose: a host program is added to every guest by naming it in
GUEST_PROGRAMS, one of powercut's C programs in GUEST_BUILD_PROGRAMS (their
`ldd` libraries come along), so running another tool in the guest (e.g.
build/pc-exec) is a one-line change. Archives are cached by
content hash across runs; per-boot data (the job and the workload) goes into
a second small archive that `boot_initrd` appends (the kernel unpacks
concatenated archives in order).
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import os
import re
import shutil
import subprocess
from collections.abc import Sequence

from foundation import paths
from foundation.errors import EnvError
from foundation.filesystems import FsType
from harness.backends import tools
from harness.backends.vm import capabilities, cpio
from harness.backends.vm.kernel import Kernel

CACHE = os.path.join(paths.CACHE, "initramfs")
GUEST_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guest")
BUSYBOX = "/bin/busybox"  # the guest's shell and applets (busybox-static; a dynamic one brings its libraries)

# Host programs copied into every guest at their host path; the file
# system's mkfs is added per fs. Busybox applets shadow PATH in the guest
# shell: scripts call these by full path.
GUEST_PROGRAMS = ["dmsetup"]
# powercut's own C programs (build/), copied to /usr/bin in the guest.
GUEST_BUILD_PROGRAMS = ["pc-dmlog", "pc-exec", "pc-recover", "pc-cover"]
# Data files those programs read (mke2fs takes its ext4 feature set from here).
GUEST_FILES = ["/etc/mke2fs.conf"]
# Loaded at boot before the file system's own module (and the dependencies of
# all of them): virtio disks, device-mapper (dm-linear is part of dm-mod),
# dm-log-writes, fuse for the mark file (pc-dmlog markfs), the file system and
# its checksum driver: capabilities.GUEST and capabilities.for_fs, resolved per kernel.
# Guest scripts: /init and one script per job.
GUEST_SCRIPTS = {"init": "init.sh", "pc/record.sh": "record.sh", "pc/recover.sh": "recover.sh", "pc/serve.sh": "serve.sh"}

_LDD_PATH = re.compile(r"(/\S+) \(0x[0-9a-f]+\)$")


def which(name: str) -> str:
    path = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if path is None:
        raise EnvError(f"{name} not found on the host: the guest gets its tools from the host (run `make deps`)")
    return path


def libraries(program: str) -> list[str]:
    """Shared libraries PROGRAM loads (the paths ldd reports, the loader included)."""
    p = subprocess.run(["ldd", program], capture_output=True, text=True)
    if p.returncode != 0:  # "not a dynamic executable": static, nothing to add
        return []
    return [m.group(1) for line in p.stdout.splitlines() if (m := _LDD_PATH.search(line.strip()))]


def _module_bytes(path: str) -> bytes:
    """A module's ELF: the guest's busybox insmod cannot read compressed modules."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".xz"):
        return lzma.decompress(data)
    if path.endswith(".gz"):
        return gzip.decompress(data)
    if path.endswith(".zst"):
        return subprocess.run(["zstd", "-dcq", path], capture_output=True, check=True).stdout
    return data


class Tree:
    """Archive members keyed by path, parent directories created on demand."""

    def __init__(self) -> None:
        self.members: dict[str, cpio.Member] = {}

    def _parents(self, path: str) -> None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            self.members.setdefault(d, cpio.directory(d))

    def add(self, member: cpio.Member) -> None:
        self._parents(member.path)
        self.members[member.path] = member

    def add_host_file(self, host_path: str, at: str | None = None, executable: bool | None = None) -> None:
        """Copy a host file's content (symlinks followed) to AT (default: its own path)."""
        with open(host_path, "rb") as f:
            data = f.read()
        if executable is None:
            executable = os.access(host_path, os.X_OK)
        self.add(cpio.file((at or host_path).lstrip("/"), data, executable))

    def add_program(self, host_path: str, at: str | None = None) -> None:
        self.add_host_file(host_path, at)
        for path in tools.wrapped(host_path) or []:  # a --tools wrapper: its loader, program, libraries
            self.add_host_file(path)
        for lib in libraries(host_path):
            if lib.lstrip("/") not in self.members:
                self.add_host_file(lib)

    def sorted_members(self) -> list[cpio.Member]:
        return [self.members[p] for p in sorted(self.members)]  # parents sort before children


def base_tree(kernel: Kernel, fs: FsType | Sequence[FsType]) -> Tree:
    """The guest for FS (or for each of several: a live guest serving a corpus of many)."""
    fss = [fs] if isinstance(fs, FsType) else list(fs)
    tree = Tree()
    for d in ["dev", "proc", "sys", "run", "tmp", "mnt", "bin", "sbin"]:
        tree.add(cpio.directory(d))
    tree.add_program(BUSYBOX, "bin/busybox")
    tree.add(cpio.symlink("bin/sh", "busybox"))
    for name in [*GUEST_PROGRAMS, *(t for f in fss for t in (f.mkfs[0], *f.guest_tools))]:
        tree.add_program(which(name))
    for name in GUEST_BUILD_PROGRAMS:
        tree.add_program(paths.c_program(name), at=f"usr/bin/{name}")
    for path in GUEST_FILES:
        if os.path.exists(path):
            tree.add_host_file(path)
    for at, name in GUEST_SCRIPTS.items():
        tree.add_host_file(os.path.join(GUEST_DIR, name), at, executable=True)
    add_modules(tree, kernel, guest_modules(kernel, [f.name for f in fss]))
    return tree


def guest_modules(kernel: Kernel, fs_names: Sequence[str], more: Sequence[capabilities.Capability] = ()) -> list[str]:
    """The modules the vm backend's guest loads on KERNEL for FS_NAMES (and MORE capabilities)."""
    caps = [*capabilities.GUEST, *(c for f in fs_names for c in capabilities.for_fs(f)), *more]
    return capabilities.modules_for(kernel, caps)


def add_modules(tree: Tree, kernel: Kernel, modules: list[str]) -> None:
    """MODULES and their dependencies as /pc/modules/*.ko, and /pc/modules.list: init's load order."""
    names = []
    for i, rel in enumerate(kernel.module_order(modules)):
        name = f"{i:02d}-{os.path.basename(rel).split('.ko')[0]}.ko"
        tree.add(cpio.file(f"pc/modules/{name}", _module_bytes(os.path.join(kernel.modules or "", rel))))
        names.append(name)
    tree.add(cpio.file("pc/modules.list", "".join(n + "\n" for n in names).encode()))


def build(kernel: Kernel, fs: FsType | Sequence[FsType]) -> str:
    """Path of the cached gzipped base initramfs for KERNEL and FS (or several; built if needed)."""
    if not os.path.exists(BUSYBOX):
        raise EnvError(f"{BUSYBOX} is missing: install busybox-static")
    return cached(base_tree(kernel, fs))


def cached(tree: Tree) -> str:
    """Path of the gzipped archive of TREE, cached by content hash (built if needed)."""
    raw = cpio.archive(tree.sorted_members())
    path = os.path.join(CACHE, hashlib.sha256(raw).hexdigest()[:24] + ".cpio.gz")
    if not os.path.exists(path):
        os.makedirs(CACHE, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(gzip.compress(raw, compresslevel=6, mtime=0))
        os.replace(tmp, path)  # atomic: concurrent builders write the same bytes
    return path


def boot_initrd(base: str, job_files: dict[str, bytes], out: str) -> str:
    """Write OUT = BASE followed by an archive of JOB_FILES (path -> content)."""
    tree = Tree()
    for path, data in job_files.items():
        tree.add(cpio.file(path, data, executable=True))
    with open(out, "wb") as f, open(base, "rb") as b:
        shutil.copyfileobj(b, f)
        f.write(cpio.gzipped(tree.sorted_members()))
    return out
