"""Thin wrappers over the system resources powercut makes: loop devices, mounts.

Every destructive call verifies first that the thing is the one powercut made
(a loop device still backed by our file, a mount point still mounted) so a
stale journal can never detach or unmount somebody else's resource.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import time

from foundation.errors import EnvError
from foundation.paths import c_program


def run(cmd: list[str], *, check: bool = True, timeout: float | None = 300,
        input: bytes | None = None, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a tool; on failure raise EnvError with its first stderr line."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           input=input.decode() if input else None, cwd=cwd)
    except FileNotFoundError as e:
        raise EnvError(f"{cmd[0]} not found: run `make deps` to install it") from e
    if check and p.returncode != 0:
        first = (p.stderr or p.stdout).strip().splitlines()
        raise EnvError(f"{' '.join(cmd)} failed (exit {p.returncode}): {first[0] if first else ''}")
    return p


def run_to_files(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run CMD with stdout and stderr going to two memory files, read once it has exited:
    (exit code, stdout, stderr); TimeoutExpired after TIMEOUT seconds (the process is killed).
    ENV: its environment (None: ours).

    For tools run once per crash state: capturing through pipes wakes the caller at every
    write the tool makes (xfs_repair writes ~30 times per run), and subprocess's wait with a
    timeout polls with growing sleeps; a pidfd wakes the caller once, when the tool exits.
    """
    out, err = os.memfd_create("stdout", os.MFD_CLOEXEC), os.memfd_create("stderr", os.MFD_CLOEXEC)
    try:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        try:
            pidfd = os.pidfd_open(p.pid)
            try:
                waiter = select.poll()   # (not select(): fd numbers may exceed FD_SETSIZE)
                waiter.register(pidfd, select.POLLIN)
                ready = waiter.poll(timeout * 1000)
            finally:
                os.close(pidfd)
            if not ready:
                raise subprocess.TimeoutExpired(cmd, timeout)
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
        return p.returncode, _read_all(out), _read_all(err)
    finally:
        os.close(out)
        os.close(err)


def _read_all(fd: int) -> str:
    """The text written to FD, newlines translated as subprocess's text mode does."""
    size = os.fstat(fd).st_size
    text = os.pread(fd, size, 0).decode(errors="replace") if size else ""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def require_tools(*names: str) -> None:
    for n in names:
        if not shutil.which(n):
            raise EnvError(f"{n} not found: run `make deps` (or install the package that has it)")


# -- mounts ----------------------------------------------------------------
def mountinfo() -> list[tuple[str, str, str]]:
    """(mount point, fs type, source) for every mount, from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            mp = left.split()[4].encode().decode("unicode_escape")
            fstype, source = right.split()[:2]
            out.append((mp, fstype, source))
    return out


def is_mounted(path: str) -> bool:
    real = os.path.realpath(path)
    return any(mp == real for mp, _, _ in mountinfo())


def mount(dev: str, path: str, fstype: str, opts: str = "") -> subprocess.CompletedProcess[str]:
    cmd = ["mount", "-t", fstype]
    if opts:
        cmd += ["-o", opts]
    return run(cmd + [dev, path], check=False, timeout=120)


def umount(path: str) -> None:
    if not is_mounted(path):
        return
    p = run(["umount", path], check=False, timeout=300)
    if p.returncode != 0 and is_mounted(path):
        # Busy (a killed workload's cwd): detach it so teardown can go on.
        run(["umount", "-l", path], timeout=60)


def fuse_unmount(path: str) -> None:
    if not is_mounted(path):
        return
    p = run(["fusermount3", "-u", path], check=False, timeout=60)
    if p.returncode != 0 and is_mounted(path):
        run(["umount", "-l", path], timeout=60)


# -- loop devices ----------------------------------------------------------
def loop_backing(dev: str) -> str | None:
    name = os.path.basename(dev)
    try:
        with open(f"/sys/block/{name}/loop/backing_file") as f:
            return f.read().strip()
    except OSError:
        return None


def loop_attach(backing: str, *, sector_size: int = 512, direct_io: bool = False, read_only: bool = False) -> str:
    cmd = ["losetup", "--find", "--show", f"--sector-size={sector_size}"]
    if read_only:
        cmd.append("--read-only")
    if direct_io:
        cmd.append("--direct-io=on")
    dev = run(cmd + [backing], timeout=60).stdout.strip()
    reset_bdi(dev)
    return dev


# Writeback limits of a loop device's bdi survive detach and re-attach: reset
# them so every recording starts like a fresh disk, whatever ran before.
BDI_DEFAULTS = {"strict_limit": "0", "min_ratio": "0", "max_ratio": "100"}


def reset_bdi(dev: str) -> None:
    st = os.stat(dev)
    bdi = f"/sys/class/bdi/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    for name, value in BDI_DEFAULTS.items():
        path = os.path.join(bdi, name)
        if os.path.exists(path):
            with open(path, "w") as f:
                f.write(value)


def loop_detach_backed_by(backing: str) -> None:
    """Detach every loop device backed by exactly BACKING (a file we created)."""
    for dev in loops_backed_by(backing, exact=True):
        p = run(["losetup", "-d", dev], check=False, timeout=60)
        # A device whose detach was already under way (detach is deferred
        # while it is still open) answers ENXIO: that is done, not an error.
        if p.returncode != 0 and loop_backing(dev) is not None and "No such device" not in p.stderr:
            raise EnvError(f"losetup -d {dev} failed: {p.stderr.strip()}")
        wait_loop_detached(dev)


def wait_loop_detached(dev: str, timeout: float = 30.0, backing: str | None = None) -> None:
    """Wait until a deferred detach has happened: the backing file is released.

    sysfs offers no event for this, so poll; the FUSE recorder cannot be
    unmounted while the loop device still holds disk.img open. With BACKING,
    wait only while DEV is still backed by that file: once free, the device
    may be reused by someone else at once.
    """
    deadline = time.monotonic() + timeout
    while (b := loop_backing(dev)) is not None and (backing is None or b.removesuffix(" (deleted)") == backing):
        if time.monotonic() > deadline:
            raise EnvError(f"{dev} still attached {timeout:.0f}s after losetup -d (something holds it open)")
        time.sleep(0.005)


def loops_backed_by(path: str, *, exact: bool = False) -> list[str]:
    """Loop devices backed by PATH (exact) or by any file under PATH."""
    out = []
    for name in sorted(os.listdir("/sys/block")):
        if not name.startswith("loop"):
            continue
        b = loop_backing(name)
        if b is None:
            continue
        b = b.removesuffix(" (deleted)")
        if b == path or (not exact and b.startswith(path.rstrip("/") + "/")):
            out.append("/dev/" + name)
    return out


# -- processes -------------------------------------------------------------
# -- device-mapper -----------------------------------------------------------
def dm_device(name: str, uuid: str) -> str | None:
    """/dev/dm-N of the mapped device NAME, if it exists and still has UUID (is the one we made)."""
    root = "/sys/block"
    for dev in os.listdir(root) if os.path.isdir(root) else []:
        try:
            with open(f"{root}/{dev}/dm/name") as f:
                if f.read().strip() != name:
                    continue
            with open(f"{root}/{dev}/dm/uuid") as f:
                return f"/dev/{dev}" if f.read().strip() == uuid else None
        except OSError:
            continue
    return None


def dm_remove(name: str, uuid: str) -> None:
    """Remove the mapped device NAME if it is still the one with UUID (pc-dmlog: DM_DEV_REMOVE)."""
    if dm_device(name, uuid) is None:
        return
    for _ in range(10):
        # udev's scan of a new device may still hold it open: the remove is
        # retried for a moment, as dmsetup's --retry does.
        p = run([c_program("pc-dmlog"), "remove", name], check=False, timeout=60)
        if p.returncode == 0 or dm_device(name, uuid) is None:
            return
        if "busy" not in p.stderr.lower():
            break
        time.sleep(0.2)
    raise EnvError(f"removing the mapped device {name} failed: {p.stderr.strip()}")


def wait_pid_gone(pid: int, timeout: float) -> bool:
    """Wait for a (possibly non-child) process to exit, via a pidfd."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready)
    finally:
        os.close(fd)
