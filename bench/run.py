"""`powercut bench`: how fast crash states are checked, next to the floor set by the kernel and fsck.

Every number is measured in the same run on the same machine, so ratios stay
meaningful on a busy box even when absolute times do not:

- crash_states_per_s[_xfs]: states mounted + fsck'ed per second of crash walk
  (tests/workloads/mixed.sh, every write entry a crash point, the default
  reorder mode, the walk's default workers: one per CPU plus one); duplicates
  skipped by hash do not count.
- floor_ms_per_state[_xfs]: kernel mount + umount (system calls, journal recovery
  included) plus fsck (the walk's own command), alone, on crash images spread
  over the workload; crash_states_per_s_over_floor[_xfs]: the walk's rate over
  that floor's on all CPUs (the floor runs alone on one). The walk runs fsck once per distinct recovered
  image (checkers/crashwalk/recovery.py FsckMemo), so it can beat the floor.
- overhead_ratio: a one-worker walk's time per checked state / the floor.
- recorder_fsync_p50_ratio: p50 of a 4 KiB append + fsync on ext4 through
  the FUSE recorder / the same on a plain loop device, both mounted at once and
  measured in turns; the median of 3 such calibrations (`--only recorder`:
  just this; docs/recorder-overhead.md).
- recorder_fsync_p50_ratio_dm: the same with the kernel's dm-log-writes as
  the recorder (the dm backend): on this kernel if it has it, else (with
  --kernel) in a guest of that kernel under TCG (bench/recorder.py);
  `--only recorder --backend dm`: just this, on this kernel (with --kernel,
  where this kernel has no dm-log-writes, in a guest of that kernel).
- recorder_run_seconds_by_scale / recorder_run_speedup_vs_issue_16: the
  recorder scenario end to end as `powercut run` runs it, every crash point,
  at scales 0.01 / 0.02 / 0.04, and issue 16's recorded "before" time over it
  (bench/oracle.py recorder_whole_runs; the target was 8x at 0.02).
- seq1_workloads_per_min: 1-3 operation workloads (creat, write, rename, each
  with fsync), each a whole run (harness/pipeline/run.py run_workload: mkfs,
  recorder, workload, every entry a crash point, default reorder) in this
  process.
- vm_seq1_workloads_per_min_per_worker (with --kernel, or `--only vm`): the
  workloads an exhaustive seq-1 campaign runs (spread over its space, btrfs),
  as a `fuzz --backend vm` worker runs them in one live guest, boot excluded;
  fuse_seq1_workloads_per_min_per_worker: the same workloads on the fuse
  backend, alternating with the vm ones in the same run; vm_cost_over_fuse:
  the ratio of the two costs per workload (issue 24's target: at most 3);
  vm_over_fuse_*_ratio: the rates' ratios (bench/vm.py, with the cost breakdown).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from typing import Any

from checkers.crashwalk.walk import WalkOptions, check_crash_states, default_jobs, default_walk_workers
from bench.vm import bench_vm
from checkers.crashwalk.recovery import FSCK_TIMEOUT_S, fsck
from foundation import kmount, ownership, paths, sysres
from bench.oracle import (BUDGET, SCALES, WHOLE_RUN_SCALES, bulk_vs_sector, incremental_vs_full,
                                  oracle_scale_curve, recorder_whole_runs)
from harness.backends.calibrate import mount_point, owned_file
from bench.recorder import bench_dm_recorder, bench_recorder, recorder_overhead
from foundation.errors import EnvError, UsageError
from foundation.filesystems import FsType, get_fs
from foundation.loopdev import recorded_loop
from harness.pipeline.config import RunConfig
from harness.pipeline.run import run_workload, terminate_as_exception
from foundation.runstate import RunState
from foundation.sparse import sync_sparse
from replay.crashpoints import first_crash_point, select_crash_points
from replay.logformat import LogReader
from replay.stateimage import build_crash_image
from workloads.runner import load_runner

VM_WORKLOADS, VM_WORKLOADS_QUICK = 11, 3   # seq-1 campaign workloads through one live guest (and through fuse)
MIXED = os.path.join(paths.ROOT, "tests", "workloads", "mixed.sh")
SEQ1 = {
    "creat-fsync": "touch foo\nsync foo\n",
    "write-fsync": "printf hello > foo\nsync foo\n",
    "rename-fsync": "touch foo\nmv foo bar\nsync .\n",
}


def _run(workload: str, out: str, **cfg: Any) -> dict[str, Any]:
    """A whole `powercut run` in this process; its report."""
    return run_workload(load_runner(workload), RunConfig.parse({"quiet": True, **cfg}), out)


def _record(fs: FsType, scratch: str, name: str) -> tuple[str, int]:
    """Record mixed.sh on FS (checking only its marks, in order); the log and device size."""
    out = os.path.join(scratch, name)
    r = _run(MIXED, out, fs=fs.name, crash_points="mark", reorder="none")
    return os.path.join(out, r["log"]), r["device_bytes"]


def _write_points(log: str) -> tuple[LogReader, list[int]]:
    reader = LogReader(log)
    return reader, select_crash_points(reader.entries(), "write", first=first_crash_point(reader))


def _walk(log: str, fs: FsType, device_bytes: int, state: RunState, jobs: int) -> dict[str, float]:
    """One walk of every write crash point of LOG; JOBS workers (0: the walk's default)."""
    _, points = _write_points(log)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    r = check_crash_states(log, points, fs=fs, mount_opts="", device_bytes=device_bytes, state=state,
                           opts=WalkOptions(jobs=jobs))
    seconds = time.perf_counter() - t0
    if r.findings:
        raise EnvError(f"bench: {fs.name} walk of mixed.sh found {r.findings[0].kind} at {r.findings[0].state_id}")
    return {"states_checked": r.states_checked, "states_duplicate": r.states_duplicate, "seconds": round(seconds, 3),
            "fsck_reused": r.fsck_reused, "image_loads": r.image_loads, "workers": jobs or default_walk_workers(),
            "states_per_s": round(r.states_checked / seconds, 1),
            "ms_per_state": round(1000 * seconds / r.states_checked, 2), "load_avg_1min": round(load, 2)}


FLOOR_IMAGES = 5


def _fsck_plain(image: str, fs: FsType) -> None:
    """fsck without the speed options of FsType.fsck_cmd (xfs_repair -o bhash), for comparison."""
    subprocess.run(fs.fsck + [image], capture_output=True, timeout=FSCK_TIMEOUT_S)


def _floor(log: str, fs: FsType, device_bytes: int, state: RunState, reps: int) -> dict[str, float]:
    """Kernel mount+umount and fsck alone, nothing else: the median of REPS runs on each of
    FLOOR_IMAGES crash images spread over the workload (recovery work differs between them), averaged.
    Where the walk's fsck command has speed options, the plain command is timed too."""
    reader, points = _write_points(log)
    src, image = os.path.join(state.scratch, "floor-src.img"), os.path.join(state.scratch, "floor.img")
    plain = fs.fsck_cmd(image) != fs.fsck + [image]
    mount_ms, fsck_ms, plain_ms = [], [], []
    with (owned_file(image, device_bytes) as fd, recorded_loop(state, image) as loop,
          mount_point(state, "floor-mnt") as mnt):
        for k in range(1, FLOOR_IMAGES + 1):
            build_crash_image(reader, f"p{points[k * len(points) // (FLOOR_IMAGES + 1)]}", device_bytes, src)
            mount_s, fsck_s, plain_s = [], [], []
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
                    if plain:
                        t0 = time.perf_counter()
                        _fsck_plain(image, fs)
                        plain_s.append(time.perf_counter() - t0)
            mount_ms.append(1000 * statistics.median(mount_s))
            fsck_ms.append(1000 * statistics.median(fsck_s))
            if plain:
                plain_ms.append(1000 * statistics.median(plain_s))
    m, f = statistics.mean(mount_ms), statistics.mean(fsck_ms)
    out = {"mount_umount_ms": round(m, 2), "fsck_ms": round(f, 2), "ms": round(m + f, 2), "images": FLOOR_IMAGES,
           "load_avg_1min": round(os.getloadavg()[0], 2),
           "fsck_cmd": " ".join(fs.fsck_cmd("IMAGE"))}
    env = fs.fsck_env()
    if env is not None:
        out["fsck_env"] = f"GLIBC_TUNABLES={env.get('GLIBC_TUNABLES', '')}"
    if plain:
        out["fsck_plain_ms"] = round(statistics.mean(plain_ms), 2)   # without the speed options
        out["fsck_plain_cmd"] = " ".join(fs.fsck + ["IMAGE"])
    return out


def _over_floor(walk: dict[str, float], floor: dict[str, float]) -> float:
    """The walk's states/s over the floor's rate on all CPUs: what bare mount+umount+fsck, one
    state after another on each CPU, does on this machine now."""
    return round(walk["states_per_s"] / (default_jobs() * 1000 / floor["ms"]), 2)


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


def bench_oracle(quick: bool) -> dict[str, Any]:
    """The content oracle's cost per crash state across recorder scales, and bulk vs sector by sector."""
    load_before = os.getloadavg()[0]
    state = RunState.create("bench-oracle")
    try:
        if quick:  # two short runs at the smallest scale
            curve = oracle_scale_curve(state.scratch, SCALES[:1], budget=5)
            ref = bulk_vs_sector(state.scratch, SCALES[0], budget=5)
            inc = incremental_vs_full(state.scratch, SCALES[0], budget=5)
        else:
            floor = lambda log, size: _floor(log, get_fs("ext4"), size, state, 1)  # noqa: E731
            curve = oracle_scale_curve(state.scratch, SCALES, floor=floor)
            ref = bulk_vs_sector(state.scratch, budget=BUDGET)
            inc = incremental_vs_full(state.scratch, budget=BUDGET)
        whole = recorder_whole_runs(state.scratch, WHOLE_RUN_SCALES[:1] if quick else WHOLE_RUN_SCALES)
    finally:
        state.teardown_or_warn()
    ms = [c["oracle_ms_per_state"] for c in curve.values()]
    walk = [c["state_ms"] for c in curve.values()]
    return {"oracle_ms_per_state_by_scale": {k: c["oracle_ms_per_state"] for k, c in curve.items()},
            "oracle_growth_ratio": round(ms[-1] / ms[0], 2) if ms[0] else None,
            # the whole cost of a crash state (build, recover, inspect, fsck) at each scale, over the smallest
            "state_ms_by_scale": {k: c["state_ms"] for k, c in curve.items()},
            "state_cost_ratio_by_scale": {k: round(c["state_ms"] / walk[0], 2) if walk[0] else None
                                          for k, c in curve.items()},
            # ... and over the bare mount+umount+e2fsck of that scale's own images (not in --quick)
            "state_over_floor_by_scale": {k: c.get("state_over_floor") for k, c in curve.items()},
            "oracle_bulk_speedup": ref["speedup"],
            "oracle_incremental_speedup": inc["speedup"],
            "recorder_run_seconds_by_scale": {k: w["seconds"] for k, w in whole.items()},
            "recorder_run_speedup_vs_issue_16": {k: w["speedup_vs_issue_16"] for k, w in whole.items()},
            "details": {"scale_curve": curve, "recorder_whole_runs": whole, "bulk_vs_sector": ref,
                        "incremental_vs_full": inc,
                        "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}}


def bench_walk(state: RunState, quick: bool) -> dict[str, Any]:
    """The crash walk on ext4 and xfs, each next to its floor measured here and now."""
    reps = 1 if quick else 3
    ext4, xfs = get_fs("ext4"), get_fs("xfs")
    log, size = _record(ext4, state.scratch, "ext4")
    ext4_walk = max((_walk(log, ext4, size, state, 0) for _ in range(reps)),
                    key=lambda w: w["states_per_s"])
    one_job = min((_walk(log, ext4, size, state, 1) for _ in range(reps)), key=lambda w: w["ms_per_state"])
    floor = _floor(log, ext4, size, state, 1 if quick else 5)
    xlog, xsize = _record(xfs, state.scratch, "xfs")
    xfs_walk = max((_walk(xlog, xfs, xsize, state, 0) for _ in range(reps)),
                   key=lambda w: w["states_per_s"])
    xfs_floor = _floor(xlog, xfs, xsize, state, 1 if quick else 3)
    return {
        "crash_states_per_s": ext4_walk["states_per_s"],
        "crash_states_per_s_xfs": xfs_walk["states_per_s"],
        "floor_ms_per_state": floor["ms"],
        "floor_ms_per_state_xfs": xfs_floor["ms"],
        "overhead_ratio": round(one_job["ms_per_state"] / floor["ms"], 2),
        "crash_states_per_s_over_floor": _over_floor(ext4_walk, floor),
        "crash_states_per_s_over_floor_xfs": _over_floor(xfs_walk, xfs_floor),
        "crash_states_per_s_target_ratio": {"ext4": round(ext4_walk["states_per_s"] / 180, 2),
                                            "xfs": round(xfs_walk["states_per_s"] / 70, 2)},
        "details": {"ext4_walk": ext4_walk, "ext4_walk_one_job": one_job, "xfs_walk": xfs_walk,
                    "floor": floor, "floor_xfs": xfs_floor},
    }


def _vm_figures(vm: dict[str, Any]) -> dict[str, Any]:
    return {"vm_seq1_workloads_per_min_per_worker": vm["vm"]["workloads_per_min"],
            "fuse_seq1_workloads_per_min_per_worker": vm["fuse"]["workloads_per_min"],
            "vm_cost_over_fuse": vm["vm_cost_over_fuse"],
            "vm_over_fuse_workloads_ratio": vm["vm_over_fuse_workloads_ratio"],
            "vm_crash_states_per_s": vm["vm"]["crash_states_per_s"],
            "vm_over_fuse_states_ratio": vm["vm_over_fuse_states_ratio"]}


def _vm_only(kernel: str | None, quick: bool) -> dict[str, Any]:
    """`bench --only vm --kernel K`: just the vm backend next to fuse on campaign workloads."""
    if not kernel:
        raise UsageError("bench --only vm needs --kernel debian:PACKAGE|PATH")
    load_before = os.getloadavg()[0]
    state = RunState.create("bench vm")
    try:
        vm = bench_vm(kernel, state.scratch, VM_WORKLOADS_QUICK if quick else VM_WORKLOADS)
    finally:
        state.teardown_or_warn()
    return {**_vm_figures(vm), "details": {"jobs": default_jobs(), "quick": quick, "kernel": os.uname().release,
                                           "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                                           "vm": vm}}


def bench(quick: bool, kernel: str | None = None, only: str = "all", backend: str = "fuse") -> dict[str, Any]:
    if only == "oracle":
        return bench_oracle(quick)
    if only == "recorder":
        return bench_recorder(quick, backend, kernel)
    if only == "vm":
        return _vm_only(kernel, quick)
    reps = 1 if quick else 3
    load_before = os.getloadavg()[0]
    state = RunState.create("bench")
    try:
        walk = bench_walk(state, quick)
        if only == "walk":
            return {**walk, "details": {"jobs": default_jobs(), "quick": quick, "kernel": os.uname().release,
                                        "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                                        **walk["details"]}}
        fsync = recorder_overhead(state, reps, 200 if quick else 1000)
        seq1 = _seq1(state.scratch, reps)
        oracle = bench_oracle(quick)
        vm = bench_vm(kernel, state.scratch, VM_WORKLOADS_QUICK if quick else VM_WORKLOADS) if kernel else None
        dm = bench_dm_recorder(kernel, state.scratch, quick)
    finally:
        state.teardown_or_warn()
    extra: dict[str, Any] = {"recorder_fsync_p50_ratio_dm": dm["ratio"]} if dm else {}
    if vm is not None:
        extra |= _vm_figures(vm)
    return {**extra,
        **{k: v for k, v in walk.items() if k != "details"},
        "recorder_fsync_p50_ratio": fsync["ratio"],
        "seq1_workloads_per_min": seq1["per_min"],
        "oracle_ms_per_state_by_scale": oracle["oracle_ms_per_state_by_scale"],
        "oracle_growth_ratio": oracle["oracle_growth_ratio"],
        "oracle_bulk_speedup": oracle["oracle_bulk_speedup"],
        "state_ms_by_scale": oracle["state_ms_by_scale"],
        "state_cost_ratio_by_scale": oracle["state_cost_ratio_by_scale"],
        "state_over_floor_by_scale": oracle["state_over_floor_by_scale"],
        "oracle_incremental_speedup": oracle["oracle_incremental_speedup"],
        "recorder_run_seconds_by_scale": oracle["recorder_run_seconds_by_scale"],
        "recorder_run_speedup_vs_issue_16": oracle["recorder_run_speedup_vs_issue_16"],
        "details": {"jobs": default_jobs(), "quick": quick, "kernel": os.uname().release,
                    "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                    **walk["details"], "fsync": fsync, "seq1": seq1, "oracle": oracle["details"],
                    **({"vm": vm} if vm else {}), **({"fsync_dm": dm} if dm else {})},
    }
