"""Host packages the vm backend needs, installed on first use.

They are not in ci/install-deps.sh: QEMU and friends are ~100 MB the default
`fuse` backend never uses. `--backend vm` installs them itself (as root, with
apt-get) and says so on stderr; without root it names what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from foundation.errors import EnvError

# File that proves the package is installed -> Debian package.
VM_HOST_PACKAGES = {
    "/usr/bin/qemu-system-x86_64": "qemu-system-x86",
    "/bin/busybox": "busybox-static",       # the guest's shell and applets
    "/usr/sbin/dmsetup": "dmsetup",          # copied into the guest
    "/usr/sbin/depmod": "kmod",              # modules.dep of downloaded kernels
    "/usr/bin/zstd": "zstd",                 # unpacking zstd-compressed kernels (6.12)
}


def missing(needs: dict[str, str]) -> list[str]:
    return sorted({pkg for path, pkg in needs.items() if not os.path.exists(path)})


def ensure(needs: dict[str, str], purpose: str) -> None:
    """Install the packages of NEEDS whose proof file is missing, or explain why not."""
    pkgs = missing(needs)
    if not pkgs:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise EnvError(f"{purpose} needs the Debian packages {' '.join(pkgs)}: install them (apt-get install {' '.join(pkgs)})")
    print(f"powercut: installing {' '.join(pkgs)} for {purpose}", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *pkgs]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:  # stale or missing package lists: refresh once
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env)
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0 or missing(needs):
        last = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EnvError(f"could not install {' '.join(pkgs)} for {purpose}: {last[0]}")
