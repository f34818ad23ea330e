"""Loop devices through ioctls: no losetup process per attach.

A crash walk keeps one loop device per worker for its whole life and only
rewrites the backing file between crash states, so what matters here is
that attaching, flushing and detaching are cheap and that a device is only
ever detached through the fd we attached it with (never by number: other
users attach and detach loop devices on the same machine concurrently).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from foundation import sysres
from foundation.errors import EnvError
from foundation.runstate import RunState

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LOOP_CLR_FD = 0x4C01
BLKFLSBUF = 0x1261
# Detach by itself when the last opener closes it: after a kill -9 the
# device goes away as soon as its mount is gone, even before `powercut cleanup`.
LO_FLAGS_AUTOCLEAR = 4
LO_FLAGS_READ_ONLY = 1
_ATTACH_RETRIES = 20


class _LoopInfo64(ctypes.Structure):
    _fields_ = [
        ("lo_device", ctypes.c_uint64), ("lo_inode", ctypes.c_uint64), ("lo_rdevice", ctypes.c_uint64),
        ("lo_offset", ctypes.c_uint64), ("lo_sizelimit", ctypes.c_uint64), ("lo_number", ctypes.c_uint32),
        ("lo_encrypt_type", ctypes.c_uint32), ("lo_encrypt_key_size", ctypes.c_uint32),
        ("lo_flags", ctypes.c_uint32), ("lo_file_name", ctypes.c_char * 64),
        ("lo_crypt_name", ctypes.c_char * 64), ("lo_encrypt_key", ctypes.c_char * 32),
        ("lo_init", ctypes.c_uint64 * 2),
    ]


class _LoopConfig(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_uint32), ("block_size", ctypes.c_uint32),
                ("info", _LoopInfo64), ("reserved", ctypes.c_uint64 * 8)]


class LoopDevice:
    """A loop device attached to BACKING; holds it open until close()."""

    def __init__(self, backing: str, *, block_size: int = 512, read_only: bool = False) -> None:
        self.backing = os.path.realpath(backing)  # as sysfs shows it
        self.path = ""
        self.fd = -1
        with open(backing, "rb" if read_only else "r+b", buffering=0) as f:
            self._attach(f.fileno(), block_size, read_only)

    def _attach(self, backing_fd: int, block_size: int, read_only: bool) -> None:
        cfg = _LoopConfig(fd=backing_fd, block_size=block_size)
        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | (LO_FLAGS_READ_ONLY if read_only else 0)
        cfg.info.lo_file_name = os.fsencode(self.backing)[-63:]
        ctl = _open("/dev/loop-control", os.O_RDWR)
        try:
            # Another process may configure the free device between our
            # GET_FREE and CONFIGURE: then it is busy and we ask again.
            for _ in range(_ATTACH_RETRIES):
                n = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
                fd = _open(f"/dev/loop{n}", os.O_RDWR | os.O_CLOEXEC)
                try:
                    fcntl.ioctl(fd, LOOP_CONFIGURE, cfg)
                except OSError as e:
                    os.close(fd)
                    if e.errno == errno.EBUSY:
                        continue
                    raise EnvError(f"LOOP_CONFIGURE /dev/loop{n} on {self.backing}: {e.strerror}") from e
                self.path, self.fd = f"/dev/loop{n}", fd
                sysres.reset_bdi(self.path)
                return
        finally:
            os.close(ctl)
        raise EnvError(f"no free loop device for {self.backing} after {_ATTACH_RETRIES} tries")

    def drop_caches(self) -> None:
        """Write back and drop the block device's page cache (BLKFLSBUF).

        The backing file is rewritten behind the device's back between crash
        states; without this a mount would read stale cached blocks.
        """
        fcntl.ioctl(self.fd, BLKFLSBUF)

    def wait_unclaimed(self, timeout: float = 30.0, *, raise_on_timeout: bool = True) -> bool:
        """Wait until no one holds the device claimed; False on timeout (unless it raises).

        umount() can return while the superblock lives on: a child forked by
        another thread during our mount holds a copy of the fs-context fd
        (and with it the superblock) until it execs. The file system shuts
        down, writing its last blocks, only when that copy goes. An exclusive
        open succeeds only once no one has the device claimed. (The probe
        itself claims the device for a moment; only this device's owner calls it.)
        """
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while True:
            try:
                os.close(os.open(self.path, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC))
                return True
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.ENXIO, errno.ENODEV):
                    raise EnvError(f"{self.path}: {e.strerror}") from e
                if time.monotonic() > deadline:
                    if raise_on_timeout:
                        raise EnvError(f"{self.path} still in use {timeout:.0f}s after umount: {e.strerror}") from e
                    return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def close(self) -> None:
        """Detach (LOOP_CLR_FD through our own fd) and wait until it is gone."""
        if self.fd < 0:
            return
        try:
            fcntl.ioctl(self.fd, LOOP_CLR_FD)
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: already detaching
                raise
        finally:
            os.close(self.fd)
            self.fd = -1
        sysres.wait_loop_detached(self.path, backing=self.backing)


def _open(path: str, flags: int) -> int:
    try:
        return os.open(path, flags)
    except OSError as e:
        raise EnvError(f"cannot open {path}: {e.strerror} (powercut needs root and the loop module)") from e


@contextmanager
def recorded_loop(state: RunState, backing: str, *, block_size: int = 512,
                  read_only: bool = False) -> Iterator[LoopDevice]:
    """A loop device on BACKING, written into STATE's journal before it exists."""
    res = state.record("loop", backing=os.path.realpath(backing))
    try:
        loop = LoopDevice(backing, block_size=block_size, read_only=read_only)
    except BaseException:
        state.released(res)
        raise
    try:
        yield loop
    finally:
        loop.close()
        state.released(res)
