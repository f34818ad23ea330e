"""Crash images moved state to state by their difference (replay/stateimage.py) are,
byte for byte, the images built from scratch, on a real log: O_DIRECT writes on xfs
through the recorder, long flush epochs with in-place overwrites, every write a crash
point, with dropped, torn (4 KiB and 512 B) and sampled states. The ranges the image
reports as rewritten are enough for a copy to follow it (checkers/crashwalk/slot.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import PcEnv, needs_root_stack
from foundation.ownership import create_file
from foundation.sparse import data_extents, mirror_range
from replay.crashpoints import first_crash_point, select_crash_points
from replay.crashstates import CrashState, ReorderSpec, plan_for_log
from replay.logformat import LogReader
from replay.replayer import Replayer
from replay import stateimage
from replay.stateimage import StateImage

K = 1024


def _direct_writes() -> dict:
    """Two O_DIRECT streams with no flush between their writes (one epoch of many writes),
    overwrites in place within the epoch and again after a flush."""
    def stream(fd: str) -> list[dict]:
        return [{"op": "write", "fd": fd, "length": 96 * K}]
    ops = [{"op": "open", "path": name, "flags": ["O_CREAT", "O_RDWR", "O_DIRECT"], "fd": name} for name in "ab"]
    ops += [{"op": "repeat", "count": 5, "ops": stream("a") + stream("b")},
            {"op": "pwrite", "fd": "a", "offset": 64 * K, "length": 128 * K},   # over two earlier writes
            {"op": "fsync", "fd": "a"},
            {"op": "pwrite", "fd": "b", "offset": 0, "length": 192 * K},
            {"op": "repeat", "count": 3, "ops": stream("a")},
            {"op": "pwrite", "fd": "a", "offset": 32 * K, "length": 64 * K},
            {"op": "fsync", "fd": "b"},
            {"op": "close", "fd": "a"}, {"op": "close", "fd": "b"}]
    return {"format": "powercut-workload/1", "name": "direct-streams", "threads": [{"name": "main", "ops": ops}]}


def _fresh(reader: LogReader, cs: CrashState, bases: dict[int, Path], size: int, tmp: Path) -> Path:
    """CS built the plain way: the log replayed through its epoch start (kept per epoch),
    then each persisted piece written in log order."""
    if cs.epoch_start not in bases:
        path = tmp / f"base-{cs.epoch_start}.img"
        bfd = create_file(str(path), size)
        try:
            with Replayer(reader, bfd, sparse=True) as r:
                r.replay_through(cs.epoch_start - 1)
        finally:
            os.close(bfd)
        bases[cs.epoch_start] = path
    out = tmp / "fresh.img"
    if out.exists():
        out.unlink()
    fd = create_file(str(out), size)
    try:
        with open(bases[cs.epoch_start], "rb") as f:
            mirror_range(f.fileno(), fd, 0, size)
        ss = reader.sectorsize
        for p in cs.pieces():
            off, n = p.start * ss, (p.stop - p.start) * ss
            if p.entry.is_discard:
                os.pwrite(fd, bytes(n), off)
            else:
                skip = (p.start - p.entry.sector) * ss
                os.pwrite(fd, reader.read_data(p.entry)[skip:skip + n], off)
    finally:
        os.close(fd)
    return out


def _differs(a: int, b: int, size: int) -> int | None:
    for off, n in sorted(set(data_extents(a, size) + data_extents(b, size))):
        if os.pread(a, n, off) != os.pread(b, n, off):
            return off
    return None


@pytest.mark.e2e
@needs_root_stack
def test_images_moved_by_difference_equal_fresh_builds(pc: PcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    wl = pc.tmp / "direct.json"
    wl.write_text(json.dumps(_direct_writes()))
    out = pc.tmp / "out"
    pc.run("run", str(wl), "--fs", "xfs", "--out", str(out), "--reorder", "none", check_rc=0)
    with LogReader(str(out / "recording.log")) as reader:
        entries = list(reader.entries())
        points = select_crash_points(entries, "write", first_crash_point(reader))
        plan = plan_for_log(reader, points, ReorderSpec.parse("drop-one,torn,torn:512,sample:2", per_point=6))
        states = list(plan.states())
        modes = {cs.mode for cs in states}
        assert {"prefix", "drop", "torn", "sample"} <= modes
        # The case this is for: many states of one epoch of many writes.
        assert max(len(cs.epoch) for cs in states) >= 8
        size = reader.device_bytes_needed()
        size += -size % (1 << 20)
        bases: dict[int, Path] = {}
        _walk(reader, states, size, bases, pc.tmp)
        # Again with every part of a write copied from the log in the kernel (as big writes are).
        monkeypatch.setattr(stateimage, "MIRROR_MIN", reader.sectorsize)
        _walk(reader, states, size, bases, pc.tmp)
        assert len(bases) >= 2   # the base moved across a flush


def _walk(reader: LogReader, states: list[CrashState], size: int, bases: dict[int, Path], tmp: Path) -> None:
    """Load STATES in order into one image, a copy following it by the changed ranges;
    both must equal each state built alone."""
    moving, follower = tmp / "moving.img", tmp / "follower.img"
    for path in (moving, follower):
        if path.exists():
            path.unlink()
    fd, ffd = create_file(str(moving), size), create_file(str(follower), size)
    try:
        with StateImage(reader, fd, track_changes=True) as image:
            for cs in states:
                image.load(cs)
                for start, end in image.take_changed():
                    mirror_range(fd, ffd, start, end)
                fresh = _fresh(reader, cs, bases, size, tmp)
                with open(fresh, "rb") as f:
                    assert _differs(fd, f.fileno(), size) is None, f"state {cs.id}: image differs from a fresh build"
                assert _differs(fd, ffd, size) is None, f"state {cs.id}: the changed ranges miss a change"
    finally:
        os.close(fd)
        os.close(ffd)
