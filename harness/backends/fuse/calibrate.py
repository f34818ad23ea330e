"""How much the FUSE recorder itself adds to a latency: fsync p50 on ext4 through
pc-recorder (no device profile) over the same on a plain loop device, both on
files in the same scratch directory. Measured in the invocation whose
latencies it qualifies (a short calibration: the machine's load changes)."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator

from harness.backends.fuse.recorded_device import FuseRecordedDevice
from harness.foundation import kmount, ownership, sysres
from harness.foundation.filesystems import get_fs
from harness.foundation.loopdev import recorded_loop
from harness.foundation.runstate import RunState

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


def fsync_p50_us(directory: str, n: int) -> float:
    """p50 of a 4 KiB append + fsync in DIRECTORY."""
    block, times = os.urandom(4096), []
    fd = os.open(os.path.join(directory, "fsync-bench"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(n):
            t0 = time.perf_counter_ns()
            os.pwrite(fd, block, i * 4096)
            os.fsync(fd)
            times.append(time.perf_counter_ns() - t0)
    finally:
        os.close(fd)
    return statistics.median(times) / 1000


def _fsync_on_ext4(state: RunState, dev: str, name: str, n: int) -> float:
    fs = get_fs("ext4")
    # Inode tables and journal written now: otherwise ext4lazyinit zeroes them in
    # the background during the measurement, through the recorder.
    sysres.run(fs.mkfs_cmd(dev, "-E lazy_itable_init=0,lazy_journal_init=0"))
    with mount_point(state, name) as mnt:
        kmount.mount(dev, mnt, fs.name)
        return fsync_p50_us(mnt, n)


def recorder_vs_loop(state: RunState, n: int) -> dict[str, float]:
    """fsync p50 through the recorder and on a plain loop device, and their ratio."""
    t0 = time.perf_counter()
    with FuseRecordedDevice(state, SIZE, os.path.join(state.scratch, "calibrate.log")) as device:
        recorder = _fsync_on_ext4(state, device.block_device, "calibrate-fuse", n)
        device.stop()
    image = os.path.join(state.scratch, "calibrate-plain.img")
    with owned_file(image, SIZE), recorded_loop(state, image) as loop:
        plain = _fsync_on_ext4(state, loop.path, "calibrate-loop", n)
    for leftover in ("calibrate.log", "calibrate-plain.img"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(state.scratch, leftover))
    return {"recorder_p50_us": round(recorder, 1), "loop_p50_us": round(plain, 1), "ratio": round(recorder / plain, 2),
            "fsyncs": n, "seconds": round(time.perf_counter() - t0, 2), "load_avg_1min": round(os.getloadavg()[0], 2)}
