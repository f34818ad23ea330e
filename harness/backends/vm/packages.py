"""Host packages the vm backend needs, installed on first use.

They are not in ci/install-deps.sh: QEMU and friends are ~100 MB the default
`fuse` backend never uses. `--backend vm` installs them itself (as root, with
apt-get) and says so on stderr; without root it names what to install.

Installs are serialised: a campaign's workers, two campaigns or a campaign
and a corpus job may all ask at once, and two apt-gets at once make one of
them fail on dpkg's lock. `ensure` takes a host-wide lock (LOCK_PATH), checks
again under it (whoever waited finds the packages there and installs
nothing), and tells apt to wait for dpkg's own lock when someone else's apt
holds it. A campaign calls it once before it starts any worker
(fuzz/campaign.py), so a failed install ends the campaign before it begins.

POWERCUT_VM_EXTRA_PACKAGES (`PATH=PACKAGE,...`) adds packages to what
`--backend vm` needs: a site's own guest tools, and the tests' way to make a
real first-use install happen on a machine that already has QEMU.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys

from foundation.errors import EnvError, UsageError

# File that proves the package is installed -> Debian package.
VM_HOST_PACKAGES = {
    "/usr/bin/qemu-system-x86_64": "qemu-system-x86",
    "/bin/busybox": "busybox-static",       # the guest's shell and applets
    "/usr/sbin/dmsetup": "dmsetup",          # copied into the guest
    "/usr/sbin/depmod": "kmod",              # modules.dep of downloaded kernels
    "/usr/bin/zstd": "zstd",                 # unpacking zstd-compressed kernels (6.12)
}
EXTRA_ENV = "POWERCUT_VM_EXTRA_PACKAGES"
LOCK_PATH = "/run/lock/powercut-packages.lock"
# Seconds apt waits for dpkg's lock when another apt (not powercut's) holds it.
DPKG_LOCK_WAIT_S = 600


def vm_host_packages() -> dict[str, str]:
    """What `--backend vm` needs: VM_HOST_PACKAGES and POWERCUT_VM_EXTRA_PACKAGES."""
    needs = dict(VM_HOST_PACKAGES)
    for item in filter(None, (s.strip() for s in os.environ.get(EXTRA_ENV, "").split(","))):
        path, sep, pkg = item.partition("=")
        if not (sep and path.startswith("/") and pkg):
            raise UsageError(f"{EXTRA_ENV}: {item!r} is not PATH=PACKAGE (an absolute path the package installs)")
        needs[path] = pkg
    return needs


def missing(needs: dict[str, str]) -> list[str]:
    return sorted({pkg for path, pkg in needs.items() if not os.path.exists(path)})


def ensure(needs: dict[str, str], purpose: str) -> None:
    """Install the packages of NEEDS whose proof file is missing, or explain why not."""
    pkgs = missing(needs)
    if not pkgs:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise EnvError(f"{purpose} needs the Debian packages {' '.join(pkgs)}: install them (apt-get install {' '.join(pkgs)})")
    with open(LOCK_PATH if os.path.isdir(os.path.dirname(LOCK_PATH)) else "/tmp/powercut-packages.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file closes
        pkgs = missing(needs)               # installed by whoever held the lock
        if pkgs:
            _install(pkgs, needs, purpose)


def _install(pkgs: list[str], needs: dict[str, str], purpose: str) -> None:
    print(f"powercut: installing {' '.join(pkgs)} for {purpose}", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends",
           "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_WAIT_S}", *pkgs]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:  # stale or missing package lists: refresh once
        subprocess.run(["apt-get", "update", "-q", "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_WAIT_S}"],
                       capture_output=True, env=env)
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0 or missing(needs):
        last = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EnvError(f"could not install {' '.join(pkgs)} for {purpose}: {last[0]}")
