"""`powercut bench`: how fast crash states are checked, next to the floor set by the kernel and fsck.

Every number is measured in the same run on the same machine, so ratios stay
meaningful on a busy box even when absolute times do not:

- crash_states_per_s[_xfs]: states mounted + fsck'ed per second of crash walk
  (tests/workloads/mixed.sh, every write entry a crash point, the default
  reorder mode, one worker per CPU); duplicates skipped by hash do not count.
- floor_ms_per_state: kernel mount + umount (system calls, journal recovery
  included) plus fsck, alone, on crash images spread over the workload.
- overhead_ratio: a one-worker walk's time per checked state / the floor.
- recorder_fsync_p50_ratio: p50 of a 4 KiB append + fsync on ext4 through
  the FUSE recorder / the same on a plain loop device.
- seq1_workloads_per_min: 1-3 operation workloads (creat, write, rename, each
  with fsync), each a whole run (harness/pipeline/run.py run_workload: mkfs,
  recorder, workload, every entry a crash point, default reorder) in this
  process.
- vm_seq1_workloads_per_min_per_worker (with --kernel): the same kind of
  workloads as a `fuzz --backend vm` worker runs them in one live guest, boot
  excluded; vm_over_fuse_*_ratio: against the fuse backend on the host
  kernel, same workloads, same run (fuzz/bench_vm.py, with the cost breakdown).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

from checkers.crash_check import check_crash_states, default_jobs
from fuzz.bench_vm import bench_vm
from checkers.recovery import fsck
from harness.foundation import kmount, ownership, paths, sysres
from harness.backends.fuse.recorded_device import FuseRecordedDevice
from harness.foundation.errors import EnvError
from harness.foundation.filesystems import FsType, get_fs
from harness.foundation.loopdev import recorded_loop
from harness.pipeline.run import RunConfig, run_workload, terminate_as_exception
from harness.foundation.runstate import RunState
from harness.foundation.sparse import sync_sparse
from replay.crashpoints import first_crash_point, select_crash_points
from replay.logformat import LogReader
from replay.stateimage import build_crash_image

VM_WORKLOADS, VM_WORKLOADS_QUICK = 8, 3   # seq-1 workloads through one live guest (and through fuse)
MIXED = os.path.join(paths.ROOT, "tests", "workloads", "mixed.sh")
SEQ1 = {
    "creat-fsync": "touch foo\nsync foo\n",
    "write-fsync": "printf hello > foo\nsync foo\n",
    "rename-fsync": "touch foo\nmv foo bar\nsync .\n",
}


@contextlib.contextmanager
def owned_file(path: str, size: int) -> Iterator[int]:
    fd = ownership.create_file(path, size)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _mount_point(state: RunState, name: str) -> Iterator[str]:
    """A mount point, recorded once for every mount made on it."""
    mnt = state.subdir(name)
    res = state.record("mount", path=mnt)
    try:
        yield mnt
    finally:
        kmount.umount(mnt)
        state.released(res)


def _run(workload: str, out: str, **cfg: Any) -> dict[str, Any]:
    """A whole `powercut run` in this process; its report."""
    return run_workload(workload, RunConfig(quiet=True, **cfg), out)


def _record(fs: FsType, scratch: str, name: str) -> tuple[str, int]:
    """Record mixed.sh on FS (checking only its marks, in order); the log and device size."""
    out = os.path.join(scratch, name)
    r = _run(MIXED, out, fs=fs.name, crash_points="mark", reorder="none")
    return os.path.join(out, r["log"]), r["device_bytes"]


def _write_points(log: str) -> tuple[LogReader, list[int]]:
    reader = LogReader(log)
    return reader, select_crash_points(reader.entries(), "write", first=first_crash_point(reader))


def _walk(log: str, fs: FsType, device_bytes: int, state: RunState, jobs: int) -> dict[str, float]:
    _, points = _write_points(log)
    t0 = time.perf_counter()
    r = check_crash_states(log, points, fs=fs, mount_opts="", device_bytes=device_bytes, state=state, jobs=jobs)
    seconds = time.perf_counter() - t0
    if r.findings:
        raise EnvError(f"bench: {fs.name} walk of mixed.sh found {r.findings[0].kind} at {r.findings[0].state_id}")
    return {"states_checked": r.states_checked, "states_duplicate": r.states_duplicate, "seconds": round(seconds, 3),
            "states_per_s": round(r.states_checked / seconds, 1),
            "ms_per_state": round(1000 * seconds / r.states_checked, 2)}


FLOOR_IMAGES = 5


def _floor(log: str, fs: FsType, device_bytes: int, state: RunState, reps: int) -> dict[str, float]:
    """Kernel mount+umount and fsck alone, nothing else: the median of REPS runs on each of
    FLOOR_IMAGES crash images spread over the workload (recovery work differs between them), averaged."""
    reader, points = _write_points(log)
    src, image = os.path.join(state.scratch, "floor-src.img"), os.path.join(state.scratch, "floor.img")
    mount_ms, fsck_ms = [], []
    with (owned_file(image, device_bytes) as fd, recorded_loop(state, image) as loop,
          _mount_point(state, "floor-mnt") as mnt):
        for k in range(1, FLOOR_IMAGES + 1):
            build_crash_image(reader, f"p{points[k * len(points) // (FLOOR_IMAGES + 1)]}", device_bytes, src)
            mount_s, fsck_s = [], []
            with open(src, "rb") as s:
                for _ in range(reps):
                    sync_sparse(s.fileno(), fd, device_bytes)  # the unrecovered image again
                    loop.drop_caches()
                    t0 = time.perf_counter()
                    kmount.mount(loop.path, mnt, fs.name, ",".join(fs.recovery_opts))
                    kmount.umount(mnt)
                    loop.wait_unclaimed()
                    mount_s.append(time.perf_counter() - t0)
                    loop.drop_caches()
                    t0 = time.perf_counter()
                    fsck(image, fs)
                    fsck_s.append(time.perf_counter() - t0)
            mount_ms.append(1000 * statistics.median(mount_s))
            fsck_ms.append(1000 * statistics.median(fsck_s))
    m, f = statistics.mean(mount_ms), statistics.mean(fsck_ms)
    return {"mount_umount_ms": round(m, 2), "fsck_ms": round(f, 2), "ms": round(m + f, 2), "images": FLOOR_IMAGES}


def _fsync_p50_us(directory: str, n: int) -> float:
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
    sysres.run(fs.mkfs_cmd(dev, ""))
    with _mount_point(state, name) as mnt:
        kmount.mount(dev, mnt, fs.name)
        return _fsync_p50_us(mnt, n)


def _recorder_vs_loop(state: RunState, n: int) -> dict[str, float]:
    size = 256 << 20
    with FuseRecordedDevice(state, size, os.path.join(state.scratch, "fsync.log")) as device:
        recorder = _fsync_on_ext4(state, device.block_device, "fsync-fuse", n)
        device.stop()
    image = os.path.join(state.scratch, "plain.img")
    with owned_file(image, size), recorded_loop(state, image) as loop:
        plain = _fsync_on_ext4(state, loop.path, "fsync-loop", n)
    return {"recorder_p50_us": round(recorder, 1), "loop_p50_us": round(plain, 1), "ratio": round(recorder / plain, 2)}


def _seq1(scratch: str, reps: int) -> dict[str, float]:
    runs, t0 = 0, time.perf_counter()
    for rep in range(reps):
        for name, script in SEQ1.items():
            path = os.path.join(scratch, f"{name}.sh")
            with open(path, "w") as f:
                f.write("set -eu\n" + script)
            _run(path, os.path.join(scratch, f"seq1-{name}-{rep}"), fs="ext4", crash_points="1")
            runs += 1
    seconds = time.perf_counter() - t0
    return {"workloads": runs, "seconds": round(seconds, 2), "per_min": round(60 * runs / seconds, 1)}


def bench(quick: bool, kernel: str | None = None) -> dict[str, Any]:
    reps = 1 if quick else 3
    load_before = os.getloadavg()[0]
    state = RunState.create("bench")
    try:
        ext4, xfs = get_fs("ext4"), get_fs("xfs")
        log, size = _record(ext4, state.scratch, "ext4")
        walks = [_walk(log, ext4, size, state, default_jobs()) for _ in range(reps)]
        ext4_walk = max(walks, key=lambda w: w["states_per_s"])
        one_job = min((_walk(log, ext4, size, state, 1) for _ in range(reps)), key=lambda w: w["ms_per_state"])
        floor = _floor(log, ext4, size, state, 1 if quick else 5)
        xlog, xsize = _record(xfs, state.scratch, "xfs")
        xfs_walk = _walk(xlog, xfs, xsize, state, default_jobs())
        fsync = _recorder_vs_loop(state, 200 if quick else 1000)
        seq1 = _seq1(state.scratch, reps)
        vm = bench_vm(kernel, state.scratch, VM_WORKLOADS_QUICK if quick else VM_WORKLOADS) if kernel else None
    finally:
        state.teardown_or_warn()
    extra: dict[str, Any] = {}
    if vm is not None:
        extra = {"vm_seq1_workloads_per_min_per_worker": vm["vm"]["workloads_per_min"],
                 "vm_over_fuse_workloads_ratio": vm["vm_over_fuse_workloads_ratio"],
                 "vm_crash_states_per_s": vm["vm"]["crash_states_per_s"],
                 "vm_over_fuse_states_ratio": vm["vm_over_fuse_states_ratio"]}
    return {**extra,
        "crash_states_per_s": ext4_walk["states_per_s"],
        "crash_states_per_s_xfs": xfs_walk["states_per_s"],
        "floor_ms_per_state": floor["ms"],
        "overhead_ratio": round(one_job["ms_per_state"] / floor["ms"], 2),
        "recorder_fsync_p50_ratio": fsync["ratio"],
        "seq1_workloads_per_min": seq1["per_min"],
        "details": {"jobs": default_jobs(), "quick": quick, "kernel": os.uname().release,
                    "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                    "ext4_walk": ext4_walk, "ext4_walk_one_job": one_job, "xfs_walk": xfs_walk,
                    "floor": floor, "fsync": fsync, "seq1": seq1, **({"vm": vm} if vm else {})},
    }
