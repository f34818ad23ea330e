"""mkfs and fsck from a Debian suite: `--tools debian:SUITE`.

A kernel newer than the host's e2fsprogs/xfsprogs/btrfs-progs is best checked
with the tools of its own release: a finding must never be an old fsck
misreading what a newer kernel (or a newer mkfs) wrote. The file system's
tool package from SUITE is fetched with powercut's own apt lists (debian.py),
with the library packages it depends on (Depends and Pre-Depends whose names
start with "lib", recursively: Debian ships shared libraries in lib*
packages), and unpacked into TOOLS_CACHE, never installed. SUITE's binaries
need SUITE's C library, so each program runs through a small wrapper,
ROOT/bin/PROG, that starts it with the suite's own ld.so and library path
(ld.so(8): the loader run as a program). The same tree works on the host
(fsck of every crash image) and in the vm guest (mkfs, xfs_db): the
initramfs copies a wrapper's loader, program and libraries with it.

The default (no --tools) is the host's tools, whose versions report.json
records just the same (docs/vm-backend.md, "Which mkfs and fsck").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace

from foundation import paths
from foundation.errors import EnvError, UsageError
from foundation.filesystems import FsType
from foundation.options import Option
from harness.backends import debian

TOOLS_CACHE = os.path.join(paths.CACHE, "tools")
PREFIX = "debian:"
_MARK = ".toolset.json"     # in a toolset's root: suite and package versions
_LIB_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu")
_LOADERS = ("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
_BIN_DIRS = ("usr/sbin", "sbin", "usr/bin", "bin")
_LIST_PATH = re.compile(r"=> (/\S+) \(0x[0-9a-f]+\)$")
# --tools, declared here as the backends declare theirs (cli/options.py builds the argument);
# every backend takes it: the host's fsck runs on every crash image, whichever recorded it.
OPTION = Option("tools", "--tools", metavar="debian:SUITE",
                help="mkfs and fsck from that Debian suite (e.g. debian:sid, for a kernel from sid), unpacked "
                     "into powercut's cache and run with the suite's own C library, in the guest and on the "
                     "host; default: the host's")


@dataclass(frozen=True)
class Toolset:
    suite: str
    root: str
    packages: dict[str, str]      # package -> version: the tool package and its libraries

    def wrapper(self, program: str) -> str:
        path = os.path.join(self.root, "bin", os.path.basename(program))
        if not os.path.exists(path):
            raise EnvError(f"--tools debian:{self.suite}: no {os.path.basename(program)} in {', '.join(self.packages)}")
        return path

    def apply(self, fs: FsType) -> FsType:
        """FS with its mkfs, fsck and guest tools from this suite."""
        return replace(fs, mkfs=[self.wrapper(fs.mkfs[0]), *fs.mkfs[1:]],
                       fsck=[self.wrapper(fs.fsck[0]), *fs.fsck[1:]],
                       guest_tools=tuple(self.wrapper(t) for t in fs.guest_tools))


def parse(spec: str | None) -> str | None:
    """The suite of `--tools debian:SUITE` (None: the host's tools); UsageError otherwise."""
    if spec is None or spec == "host":
        return None
    suite = spec.removeprefix(PREFIX)
    if not spec.startswith(PREFIX) or suite not in debian.SUITE_NAMES:
        raise UsageError(f"--tools {spec}: give debian:SUITE, a suite of {', '.join(debian.SUITE_NAMES)} (or host)")
    return suite


def for_fs(spec: str | None, fs: FsType) -> FsType:
    """FS as the run uses it under `--tools SPEC`: the host's tools, or the suite's."""
    suite = parse(spec)
    return fs if suite is None else toolset(suite, fs.fsck_package).apply(fs)


def report(spec: str | None, fs_name: str, fsck_package: str) -> dict[str, object]:
    """report.json's `tools`: where mkfs and fsck came from, and the versions of their packages."""
    suite = parse(spec)
    if suite is None:
        return {"from": "host", "packages": {fsck_package: host_version(fsck_package)}}
    return {"from": f"debian:{suite}", "packages": toolset(suite, fsck_package).packages}


def host_version(pkg: str) -> str | None:
    p = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True)
    return p.stdout.strip() or None if p.returncode == 0 else None


def toolset(suite: str, package: str) -> Toolset:
    tool = debian.find(package, suite)
    if tool is None:
        raise EnvError(f"--tools debian:{suite}: {suite} has no package {package}")
    root = os.path.join(TOOLS_CACHE, f"{suite}_{tool.name}_{tool.version}")
    if not os.path.exists(os.path.join(root, _MARK)):
        _fetch(suite, tool, root)
    with open(os.path.join(root, _MARK)) as f:
        mark = json.load(f)
    return Toolset(suite, root, mark["packages"])


def _closure(suite: str, tool: debian.Candidate) -> list[debian.Candidate]:
    """TOOL and the lib* packages it needs, recursively, each in SUITE's version."""
    out, todo, seen = [], [tool], {tool.name}
    while todo:
        pkg = todo.pop()
        out.append(pkg)
        info = debian.show(pkg)
        for field in ("Pre-Depends", "Depends"):
            for entry in filter(None, (e.strip() for e in info.get(field, "").split(","))):
                name = re.split(r"[\s(|:]", entry.split("|")[0].strip(), maxsplit=1)[0]
                if name.startswith("lib") and name not in seen:
                    seen.add(name)
                    dep = debian.find(name, suite)
                    if dep is not None:  # a virtual name: the loader check below catches a library left out
                        todo.append(dep)
    return out


def _fetch(suite: str, tool: debian.Candidate, root: str) -> None:
    os.makedirs(TOOLS_CACHE, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{suite}-{tool.name}-", dir=TOOLS_CACHE)
    try:
        pkgs = _closure(suite, tool)
        debian.unpack(pkgs, tmp)
        loader = _loader(tmp)
        os.makedirs(os.path.join(tmp, "bin"), exist_ok=True)
        for d in _BIN_DIRS:
            full = os.path.join(tmp, d)
            if d != "bin" and os.path.isdir(full):
                for prog in os.listdir(full):
                    _write_wrapper(tmp, loader, os.path.join(d, prog))
        with open(os.path.join(tmp, _MARK), "w") as f:
            json.dump({"suite": suite, "packages": {p.name: p.version for p in pkgs}}, f, indent=1, sort_keys=True)
        try:
            os.rename(tmp, root)
        except OSError:
            if not os.path.exists(os.path.join(root, _MARK)):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _loader(root: str) -> str:
    for rel in _LOADERS:
        if os.path.exists(os.path.join(root, rel)):
            return rel
    raise EnvError(f"{root}: the suite's libc6 brought no ld-linux-x86-64.so.2")


def _write_wrapper(root: str, loader: str, rel: str) -> None:
    """ROOT/bin/NAME: REL started by the suite's loader; paths relative to the wrapper (host or guest)."""
    path = os.path.join(root, "bin", os.path.basename(rel))
    if os.path.exists(path) or not os.path.isfile(os.path.join(root, rel)):
        return
    libpath = ":".join(f"$d/{d}" for d in _LIB_DIRS)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n"
                "d=$(cd \"$(dirname \"$0\")/..\" && pwd)\n"
                "[ -f \"$d/etc/mke2fs.conf\" ] && export MKE2FS_CONFIG=\"$d/etc/mke2fs.conf\"\n"
                f"exec \"$d/{loader}\" --library-path \"{libpath}\" \"$d/{rel}\" \"$@\"\n")
    os.chmod(path, 0o755)


def wrapped(wrapper: str) -> list[str] | None:
    """Every file (host path) WRAPPER needs besides itself: the loader, the program, its libraries,
    mke2fs.conf; None if WRAPPER is not a toolset's wrapper. What a guest must carry with it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(wrapper)))
    if not os.path.exists(os.path.join(root, _MARK)):
        return None
    with open(wrapper) as f:
        m = re.search(r'exec "\$d/(\S+)" --library-path "\S+" "\$d/(\S+)"', f.read())
    if m is None:
        return None
    loader, program = (os.path.join(root, p) for p in m.groups())
    libpath = ":".join(os.path.join(root, d) for d in _LIB_DIRS)
    p = subprocess.run([loader, "--library-path", libpath, "--list", program], capture_output=True, text=True)
    if p.returncode != 0 or "not found" in p.stdout:
        missing = [line.split()[0] for line in p.stdout.splitlines() if "not found" in line]
        raise EnvError(f"{program}: its libraries are not all in the toolset (missing {', '.join(missing) or p.stderr.strip()})")
    libs = [m2.group(1) for line in p.stdout.splitlines() if (m2 := _LIST_PATH.search(line.strip()))]
    extra = [c for c in (os.path.join(root, "etc", "mke2fs.conf"),) if os.path.exists(c)]
    return [loader, program, *libs, *extra]
