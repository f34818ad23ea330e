"""Block devices the user names for `--backend dm` (`--data-dev`, `--log-dev`), and the checks
that keep powercut off anything it must not erase.

A device powercut did not create is used only if the command line names it
in `--i-know-this-erases DEV`; even then it is refused while it, or one of
its partitions, is mounted, used as swap, held by another block device
(dm, md, ...) or open exclusively by anyone.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
from dataclasses import dataclass

from foundation.errors import EnvError, RefusedError, UsageError

CONFIRM_FLAG = "--i-know-this-erases"
_BLKGETSIZE64 = 0x80081272
_BLKSSZGET = 0x1268
_BLKZEROOUT = 0x127F


@dataclass(frozen=True)
class UserDevices:
    data: str        # resolved paths
    log: str


def _sysfs(rdev: int) -> str:
    return f"/sys/dev/block/{os.major(rdev)}:{os.minor(rdev)}"


def _family(rdev: int) -> set[tuple[int, int]]:
    """The device and its partitions, as (major, minor)."""
    out = {(os.major(rdev), os.minor(rdev))}
    base = os.path.realpath(_sysfs(rdev))
    for name in os.listdir(base) if os.path.isdir(base) else []:
        try:
            with open(os.path.join(base, name, "dev")) as f:
                major, minor = f.read().strip().split(":")
            out.add((int(major), int(minor)))
        except OSError:
            continue
    return out


def _mounted(family: set[tuple[int, int]]) -> bool:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            major, minor = line.split()[2].split(":")
            if (int(major), int(minor)) in family:
                return True
    return False


def _swap(family: set[tuple[int, int]]) -> bool:
    try:
        with open("/proc/swaps") as f:
            names = [line.split()[0] for line in f.readlines()[1:] if line.strip()]
    except OSError:
        return False
    for name in names:
        try:
            st = os.stat(name)
        except OSError:
            continue
        if stat.S_ISBLK(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) in family:
            return True
    return False


def _held(family: set[tuple[int, int]]) -> bool:
    for major, minor in family:
        holders = f"/sys/dev/block/{major}:{minor}/holders"
        if os.path.isdir(holders) and os.listdir(holders):
            return True
    return False


def check_device(path: str, option: str, confirmed: list[str]) -> str:
    """PATH (from OPTION) resolved, if powercut may erase it; else RefusedError/UsageError."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as e:
        raise UsageError(f"{option} {path}: {e.strerror}") from None
    if not stat.S_ISBLK(st.st_mode):
        raise UsageError(f"{option} {path}: not a block device")
    if real not in {os.path.realpath(c) for c in confirmed}:
        raise RefusedError(f"refusing to erase {path} ({option}): powercut did not create it; "
                           f"add {CONFIRM_FLAG} {path} if everything on it may be lost")
    family = _family(st.st_rdev)
    if _mounted(family):
        raise RefusedError(f"refusing to use {path} ({option}): it (or a partition of it) is mounted")
    if _swap(family):
        raise RefusedError(f"refusing to use {path} ({option}): it (or a partition of it) is swap")
    if _held(family):
        raise RefusedError(f"refusing to use {path} ({option}): another block device (dm, md, ...) holds it")
    try:
        os.close(os.open(real, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC))
    except OSError as e:
        raise RefusedError(f"refusing to use {path} ({option}): it is in use ({e.strerror})") from None
    return real


def user_devices(data: str | None, log: str | None, confirmed: list[str]) -> UserDevices | None:
    """The devices of --data-dev/--log-dev, checked; None when powercut makes its own (loop devices)."""
    if data is None and log is None:
        if confirmed:
            raise UsageError(f"{CONFIRM_FLAG} goes with --data-dev and --log-dev")
        return None
    if data is None or log is None:
        raise UsageError("--data-dev and --log-dev go together: the data device and the log device")
    devices = UserDevices(check_device(data, "--data-dev", confirmed), check_device(log, "--log-dev", confirmed))
    if devices.data == devices.log:
        raise UsageError("--data-dev and --log-dev must be two devices")
    return devices


def _query(dev: str, request: int, fmt: str) -> int:
    fd = os.open(dev, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return struct.unpack(fmt, fcntl.ioctl(fd, request, b"\0" * struct.calcsize(fmt)))[0]
    finally:
        os.close(fd)


def size_bytes(dev: str) -> int:
    return _query(dev, _BLKGETSIZE64, "Q")


def sector_size(dev: str) -> int:
    return _query(dev, _BLKSSZGET, "i")


def zero_out(dev: str, length: int) -> None:
    """Zero the first LENGTH bytes of DEV: replays start from zeros, so must the device."""
    fd = os.open(dev, os.O_WRONLY | os.O_EXCL | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, _BLKZEROOUT, struct.pack("QQ", 0, length))
    except OSError as e:
        raise EnvError(f"zeroing {dev} failed: {e.strerror}") from None
    finally:
        os.close(fd)
