"""Does this kernel have device-mapper and dm-log-writes? (`--backend dm` / `auto`)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

from foundation import paths
from foundation.errors import EnvError

CONTROL = "/dev/mapper/control"
TARGET = "log-writes"


def _modprobe(module: str) -> None:
    """Load MODULE if the kernel has it as a module (quietly: absence is answered by the caller)."""
    if shutil.which("modprobe"):
        subprocess.run(["modprobe", "-q", module], capture_output=True, timeout=60)


def _targets(exe: str) -> list[str] | None:
    p = subprocess.run([exe, "targets"], capture_output=True, text=True, timeout=60)
    return p.stdout.split() if p.returncode == 0 else None


def missing() -> str | None:
    """None if a log-writes target can be made here, else why not (one line)."""
    exe = paths.c_program("pc-dmlog")
    if not os.path.exists(CONTROL):
        _modprobe("dm_mod")
    targets = _targets(exe) if os.path.exists(CONTROL) else None
    if targets is None:
        return (f"device-mapper is missing: kernel {platform.release()} has no {CONTROL} and `modprobe dm-mod` "
                "did not add it; use --backend fuse, or --backend vm to record in a guest kernel")
    if TARGET not in targets:
        _modprobe("dm_log_writes")
        targets = _targets(exe) or []
    if TARGET not in targets:
        return (f"dm-log-writes is missing: kernel {platform.release()} has device-mapper but no log-writes "
                "target (CONFIG_DM_LOG_WRITES); use --backend fuse, or --backend vm")
    return None


def require() -> None:
    reason = missing()
    if reason:
        raise EnvError(reason)
