"""How much a backend's recorded device itself adds to a latency: fsync p50 on
ext4 through the recorder (fuse: pc-recorder without a device profile; dm:
the kernel's dm-log-writes over loop devices) over the same on a plain loop
device, all on files in the same scratch directory, both file systems
mounted at once and measured in turns (one fsync on each per round).
Measured in the invocation whose latencies it qualifies (a short
calibration: the machine's load changes)."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

from harness.backends.device import RecordedDevice
from foundation import kmount, ownership, sysres
from foundation.filesystems import get_fs
from foundation.loopdev import recorded_loop
from foundation.runstate import RunState
from replay.logformat import LogReader

SIZE = 256 << 20


@contextlib.contextmanager
def owned_file(path: str, size: int) -> Iterator[int]:
    fd = ownership.create_file(path, size)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def mount_point(state: RunState, name: str) -> Iterator[str]:
    """A mount point, recorded once for every mount made on it."""
    mnt = state.subdir(name)
    res = state.record("mount", path=mnt)
    try:
        yield mnt
    finally:
        kmount.umount(mnt)
        state.released(res)


WARMUP = 20  # first fsyncs of a fresh file system (block allocation, journal start) not counted


def _ext4_on(state: RunState, stack: contextlib.ExitStack, dev: str, name: str) -> int:
    """A fresh ext4 on DEV, mounted; an fd of an empty file in it (closed by STACK)."""
    fs = get_fs("ext4")
    # Inode tables and journal written now: otherwise ext4lazyinit zeroes them in
    # the background during the measurement, through the recorder.
    sysres.run(fs.mkfs_cmd(dev, "-E lazy_itable_init=0,lazy_journal_init=0"))
    mnt = stack.enter_context(mount_point(state, name))
    kmount.mount(dev, mnt, fs.name)
    fd = os.open(os.path.join(mnt, "fsync-bench"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    stack.callback(os.close, fd)
    return fd


def fsync_p50s_us(fds: list[int], n: int) -> list[float]:
    """p50 of a 4 KiB append + fsync on each of FDS, taken in turn (one on each, then
    the next round): load that comes and goes hits all of them alike."""
    block, times = os.urandom(4096), [[] for _ in fds]
    for i in range(WARMUP + n):
        for fd, ts in zip(fds, times):
            t0 = time.perf_counter_ns()
            os.pwrite(fd, block, i * 4096)
            os.fsync(fd)
            if i >= WARMUP:
                ts.append(time.perf_counter_ns() - t0)
    return [statistics.median(ts) / 1000 for ts in times]


TAG = "-calibrate"  # the recorded device's files and mount points, apart from the run's own


def recorder_vs_loop(state: RunState, n: int, device_cls: type[RecordedDevice]) -> dict[str, Any]:
    """fsync p50 through DEVICE_CLS's recorder and on a plain loop device, and their ratio."""
    t0 = time.perf_counter()
    image = os.path.join(state.scratch, "calibrate-plain.img")
    # Teardown in reverse: file systems, then the recorder (its devices, daemons) and the plain loop.
    with contextlib.ExitStack() as stack:
        device = stack.enter_context(device_cls(state, SIZE, os.path.join(state.scratch, "calibrate.log"), tag=TAG))
        stack.enter_context(owned_file(image, SIZE))
        loop = stack.enter_context(recorded_loop(state, image))
        with contextlib.ExitStack() as mounted:
            fds = [_ext4_on(state, mounted, device.block_device, f"calibrate-{device_cls.name}"),
                   _ext4_on(state, mounted, loop.path, "calibrate-loop")]
            recorder, plain = fsync_p50s_us(fds, n)
        device.stop()
        flushes = _log_flushes(device.log_path)
        leftovers = [device.log_path, image, *device.scratch_files()]
    for leftover in leftovers:
        with contextlib.suppress(OSError):
            os.unlink(leftover)
    return {"backend": device_cls.name, "recorder_p50_us": round(recorder, 1), "loop_p50_us": round(plain, 1), "ratio": round(recorder / plain, 2),
            "fsyncs": n, "log_flushes": flushes, "seconds": round(time.perf_counter() - t0, 2), "load_avg_1min": round(os.getloadavg()[0], 2)}


def _log_flushes(log: str) -> int | None:
    """Flush requests the recorder logged: the block layer's own count of what the fsyncs asked
    of the device (each fsync on ext4 ends in at least one), a check on `fsyncs` from outside."""
    try:
        with LogReader(log) as r:
            return sum(e.is_flush for e in r.entries())
    except (OSError, ValueError):
        return None
