"""The incremental crash walk against the full one on the same recovered images.

- The write tracker sees exactly the writes that reach a loop device.
- A worker that restores its crash image from the ranges the log and the
  kernel changed (instead of comparing whole images) holds exactly the
  reference image at every state, recovery writes included (ext4, xfs).
- The hash it keeps of each recovered image (by which fsck verdicts are
  reused) is the hash of that image's bytes, and a reused verdict is what
  fsck says when run again on the image.
- The content oracle that reuses the bytes and verdicts of files unchanged
  since the worker's previous state gives the same findings and loss-window
  rows as one that reads and checks every file at every state, on real
  runs with dropped and torn writes and with stale data (ext4, xfs).
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any

import pytest

from checkers.history import build_history
from checkers.oracle import ContentOracle
from checkers.workload_checks import log_marks
from common import require_exec, require_root
from conftest import WORKLOADS, PcEnv, needs_root_stack
from foundation.sparse import data_extents
from replay.logformat import LogReader
from test_oracle_bulk import INVARIANTS, OPS, verdicts
from workloads.results import read_records

pytestmark = [require_exec,
              require_root]


def test_write_tracker_sees_every_write_to_its_device(pc: PcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    from foundation.blockwrites import open_tracker
    from foundation.loopdev import recorded_loop
    from foundation.runstate import RunState

    monkeypatch.setenv("POWERCUT_STATE_DIR", str(pc.state))
    monkeypatch.setenv("POWERCUT_SCRATCH", str(pc.scratch))
    state = RunState.create("tracker-test")
    try:
        image = os.path.join(state.scratch, "img")
        with open(image, "wb") as f:
            f.truncate(8 << 20)
        with recorded_loop(state, image) as loop:
            tracker = open_tracker(state, [loop.path], "t")
            if tracker is None:
                pytest.skip("no block tracepoints here (tracefs)")
            try:
                assert tracker.drain(loop.path) == []
                fd = os.open(loop.path, os.O_RDWR | os.O_DIRECT)
                try:
                    aligned = mmap.mmap(-1, 8192)  # O_DIRECT wants page-aligned buffers
                    aligned.write(bytes(range(256)) * 32)
                    os.pwrite(fd, aligned, 1 << 20)
                    os.pwrite(fd, memoryview(aligned)[:4096], 3 << 20)
                    os.preadv(fd, [mmap.mmap(-1, 4096)], 5 << 20)  # a read changes nothing
                finally:
                    os.close(fd)
                assert tracker.drain(loop.path) == [(1 << 20, (1 << 20) + 8192), (3 << 20, (3 << 20) + 4096)]
                assert tracker.drain(loop.path) == []
            finally:
                tracker.close()
            # One tracer for two devices (a walk's workers): each drain gets its own device's writes.
            other = os.path.join(state.scratch, "img2")
            with open(other, "wb") as f:
                f.truncate(8 << 20)
            with recorded_loop(state, other) as loop2:
                tracker = open_tracker(state, [loop.path, loop2.path], "t2")
                assert tracker is not None
                try:
                    for dev, off in ((loop.path, 2 << 20), (loop2.path, 4 << 20)):
                        fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
                        try:
                            os.pwrite(fd, mmap.mmap(-1, 4096), off)
                        finally:
                            os.close(fd)
                    assert tracker.drain(loop2.path) == [(4 << 20, (4 << 20) + 4096)]
                    assert tracker.drain(loop.path) == [(2 << 20, (2 << 20) + 4096)]
                    assert tracker.drain(loop.path) == tracker.drain(loop2.path) == []
                finally:
                    tracker.close()
    finally:
        state.teardown_or_warn()


def _image_hash(path: str, sectorsize: int) -> int:
    """The content hash of replay/statehash.py, from scratch over the image's data."""
    from replay.statehash import sector_hash
    value = 0
    with open(path, "rb") as f:
        for off, n in data_extents(f.fileno(), os.fstat(f.fileno()).st_size):
            data = memoryview(os.pread(f.fileno(), n, off))
            for i in range(0, n, sectorsize):
                value ^= sector_hash(data[i:i + sectorsize], (off + i) // sectorsize)
    return value


def _same_image(a: str, b: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        size = os.fstat(fa.fileno()).st_size
        regions = sorted(set(data_extents(fa.fileno(), size) + data_extents(fb.fileno(), size)))
        for off, n in regions:
            if os.pread(fa.fileno(), n, off) != os.pread(fb.fileno(), n, off):
                return False
    return True


class Pair:
    """The same history checked twice on every image: incrementally (the default) and in full."""

    def __init__(self, history: Any, wid: int, fs: str, invariants: dict | None) -> None:
        self.inc = ContentOracle(history, wid, fs, invariants)
        self.full = ContentOracle(history, wid, fs, invariants)
        self.full.incremental = False
        self.compared = 0
        self.kinds: set[str] = set()

    def compare(self, mnt: str, point: int, state_id: str) -> None:
        a, b = self.inc.inspect(mnt, point, state_id), self.full.inspect(mnt, point, state_id)
        assert verdicts(a) == verdicts(b), f"state {state_id}"
        assert self.inc.loss_rows == self.full.loss_rows, f"state {state_id}"
        assert self.inc.torn_rows == self.full.torn_rows, f"state {state_id}"
        self.compared += 1
        self.kinds |= {f.kind for f in a}


# In-place overwrites: the file's size and extents stay, only the bytes under them change.
OVERWRITES = [
    {"op": "open", "path": "D", "flags": ["O_CREAT", "O_RDWR"], "fd": "d"},
    {"op": "pwrite", "fd": "d", "offset": 0, "length": 65536},
    {"op": "fsync", "fd": "d"},
    {"op": "repeat", "count": 6, "ops": [{"op": "pwrite", "fd": "d", "offset": 0, "length": 65536},
                                         {"op": "fdatasync", "fd": "d"}]},
    {"op": "close", "fd": "d"},
]


def _workload(tmp: Path) -> Path:
    doc = {"format": "powercut-workload/1", "name": "incremental", "invariants": INVARIANTS,
           "threads": [{"name": "main", "ops": OVERWRITES + OPS}]}
    path = tmp / "incremental.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.e2e
@needs_root_stack
@pytest.mark.parametrize("fs,workload,opts,kinds", [
    ("ext4", None, {"reorder": "drop-one,torn:512"}, None),
    ("xfs", None, {"reorder": "drop-one,torn:512"}, None),
    ("ext4", "stale_writeback.json", {"mount_opts": "data=writeback,nodelalloc", "size_mib": 32}, {"stale-data"}),
])
def test_incremental_walk_matches_the_full_one(pc: PcEnv, monkeypatch: pytest.MonkeyPatch, fs: str,
                                               workload: str | None, opts: dict[str, Any], kinds: set[str] | None) -> None:
    from checkers.crashwalk import recovery
    from checkers.crashwalk import slot as checkslot
    from checkers.crashwalk import walk as crash_check
    from harness.pipeline.config import RunConfig
    from harness.pipeline.run import run_checked
    from workloads.runner import load_runner

    monkeypatch.setenv("POWERCUT_STATE_DIR", str(pc.state))
    monkeypatch.setenv("POWERCUT_SCRATCH", str(pc.scratch))
    # Every image a worker loads must be exactly its reference state.
    loads = {"states": 0, "by_ranges": 0}
    load = checkslot.CheckSlot.load

    def checked_load(self: checkslot.CheckSlot, cs: Any) -> Any:
        dev = load(self, cs)
        assert _same_image(self.ref_path, self.image), f"worker image differs from state {cs.id}"
        loads["states"] += 1
        loads["by_ranges"] = max(loads["by_ranges"], self.restores["ranges"])
        return dev

    monkeypatch.setattr(checkslot.CheckSlot, "load", checked_load)
    # Every recovered image's hash must be its bytes' hash; every reused fsck verdict what fsck says.
    hashed = {"known": 0, "reused": 0}
    recovered_hash = checkslot.CheckSlot.recovered_hash

    def checked_hash(self: checkslot.CheckSlot, state_hash: int) -> int | None:
        value = recovered_hash(self, state_hash)
        if value is not None:
            assert value == _image_hash(self.image, self.sectorsize), "recovered image hash"
            hashed["known"] += 1
        return value

    monkeypatch.setattr(checkslot.CheckSlot, "recovered_hash", checked_hash)
    fsck_verdict = recovery.fsck_verdict

    def checked_fsck(image: str, fs_: Any, content: Any = None, memo: Any = None) -> Any:
        v = fsck_verdict(image, fs_, content, memo)
        if v.fsck_reused:
            assert (v.fsck_code, v.fsck_output) == recovery.fsck(image, fs_), "reused fsck verdict"
            hashed["reused"] += 1
        return v

    monkeypatch.setattr(recovery, "fsck_verdict", checked_fsck)
    monkeypatch.setattr(crash_check, "TRACK_MIN_STATES", 0)  # follow the kernel's writes even in short walks
    runner = load_runner(str(WORKLOADS / workload) if workload else str(_workload(pc.tmp)))
    out = pc.tmp / "out"
    pairs: list[Pair] = []

    def inspect(mnt: str, cs: Any) -> list:
        if not pairs:
            with LogReader(str(out / "recording.log")) as reader:
                marks = log_marks(reader)
            history = build_history(runner.plan, read_records(str(out / "records.bin"), runner.plan), marks)
            pairs.append(Pair(history, runner.plan.wid, fs, dict(runner.workload.invariants or {})))
        pairs[0].compare(mnt, cs.point, cs.id)
        return []

    cfg = RunConfig.parse({"fs": fs, "quiet": True, "jobs": 2, "crash_points": "write" if workload is None else None,
                           **opts})
    result = run_checked(runner, cfg, str(out), inspect)
    pair = pairs[0]
    assert pair.compared == result.report["crash_states_checked"] > 10
    if kinds is not None:
        assert pair.kinds == kinds  # damaged states were among those compared
    if loads["by_ranges"] == 0:
        pytest.skip("no block tracepoints here: the walk compared whole images")
    assert loads["states"] >= pair.compared
    assert hashed["known"] > 0
    assert result.report["crash_walk"]["fsck_reused"] == hashed["reused"]
    assert pair.inc.files.reused > 0  # the incremental path was taken, not only the full one
    assert pair.full.files.reused == 0
