"""Crash states within flush epochs, their ids, hashes and images, on hand-written logs (no root needed)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from conftest import POWERCUT, ROOT

from foundation.errors import UsageError
from foundation.ownership import create_file
from replay.crashpoints import mark_range, select_crash_points
from replay.crashstates import CrashPlan, ReorderSpec, plan_for_log
from replay.logformat import FUA, LogReader, LogWriter
from replay.statehash import StateHasher
from replay.stateimage import StateImage, build_crash_image

SS = 512
SIZE = 64 * 1024
ALL_MODES = "drop-one,torn,torn:512,sample:5,exhaustive:3"


def fill(byte: int, n: int) -> bytes:
    return bytes([byte]) * n


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """mkfs, an epoch of three writes, a FUA write, a write and a discard, marks in between."""
    path = tmp_path / "small.log"
    with LogWriter(str(path)) as w:
        w.write(0, fill(1, 4096))          # 0  "mkfs"
        w.flush()                          # 1
        w.mark("pc:mkfs-done")             # 2
        w.write(8, fill(2, 8192))          # 3  two 4 KiB units
        w.write(24, fill(3, 1024))         # 4
        w.write(8, fill(4, 512))           # 5  overwrites the start of 3
        w.flush()                          # 6
        w.write(40, fill(5, 4096), FUA)    # 7  FUA: durable once logged
        w.write(48, fill(6, 4096))         # 8
        w.discard(8, 8)                    # 9
        w.mark("m")                        # 10
        w.write(48, fill(6, 4096))         # 11 same bytes as 8 again
    return path


def plan(log: Path, spec: str = "none", points: list[int] | None = None, per_point: int = 16) -> CrashPlan:
    reader = LogReader(str(log))
    return plan_for_log(reader, points or list(range(reader.nr_entries)), ReorderSpec.parse(spec, per_point))


def epoch_of(p: CrashPlan, point: int) -> list[int]:
    return [e.index for e in next(p.states_at(point)).epoch]


def test_epochs_follow_completed_flushes(log: Path) -> None:
    p = plan(log)
    assert epoch_of(p, 2) == []             # mkfs is durable
    assert epoch_of(p, 5) == [3, 4, 5]
    assert epoch_of(p, 6) == [3, 4, 5]      # the flush at 6 is still in flight at its own crash point
    assert epoch_of(p, 7) == [7]            # ... and complete once entry 7 is logged
    assert epoch_of(p, 10) == [7, 8, 9]
    # The FUA write is never dropped.
    assert {s.id for s in p.states_at(10)} == {"p10"}
    assert [s.id for s in plan(log, "drop-one").states_at(10)] == ["p10", "p10-d8", "p10-d9"]


def test_every_state_id_rebuilds_the_same_state(log: Path) -> None:
    p = plan(log, ALL_MODES)
    states = list(p.states())
    assert len({s.id for s in states}) == len(states)
    assert {s.mode for s in states} == {"prefix", "drop", "torn", "sample", "exhaustive"}
    for s in states:
        again = p.state(s.id)
        assert (again.point, again.epoch_start, again.dropped, again.tear) == (s.point, s.epoch_start, s.dropped, s.tear)
        assert list(again.pieces()) == list(s.pieces())


def test_torn_writes_split_at_unit_boundaries(log: Path) -> None:
    p = plan(log, "torn")
    tears = [s for s in p.states_at(5) if s.mode == "torn"]
    assert [s.id for s in tears] == ["p5-t3k0-1", "p5-t3k1-2"]
    assert [(t.tear.start, t.tear.stop) for t in tears] == [(8, 16), (16, 24)]
    small = [s.id for s in plan(log, "torn:512").states_at(5) if s.mode == "torn"]
    assert "p5-t3s0-8" in small and "p5-t4s0-1" in small and len(small) == 6 + 2
    assert p.state("p5-t3s2-5").tear.start == 10   # a middle part, by id


@pytest.mark.parametrize("state_id,message", [
    ("q5", "not a state id"),
    ("p99", "the log has entries 0..12"),
    ("p10-d7", "not a droppable write"),     # FUA
    ("p5-d8", "not a droppable write"),      # not yet logged
    ("p5-t3k0-2", "not all of it"),
    ("p5-e7", "masks go up to 6"),
])
def test_bad_state_ids(log: Path, state_id: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        plan(log).state(state_id)


def test_cap_per_point_is_a_seeded_sample(tmp_path: Path) -> None:
    path = tmp_path / "long.log"
    with LogWriter(str(path)) as w:
        for i in range(40):
            w.write(8 * i, fill(i + 1, 4096))
    a = [s.id for s in plan(path, "drop-one", [39], per_point=5).states()]
    b = [s.id for s in plan(path, "drop-one", [39], per_point=5).states()]
    assert a == b and len(a) == 1 + 5
    # exhaustive:K on a bigger epoch samples instead of enumerating 2^40 subsets
    assert [s.mode for s in plan(path, "exhaustive:4", [39], per_point=5).states()] == ["prefix"] + ["sample"] * 5


@pytest.mark.parametrize("spec", ["", "drop", "torn:1024", "sample:0", "exhaustive:17", "none,drop-one"])
def test_bad_reorder_specs(spec: str) -> None:
    with pytest.raises(UsageError, match="--reorder"):
        ReorderSpec.parse(spec)


def image_hash(path: Path) -> int:
    """The hash statehash.py keeps incrementally, computed from scratch."""
    data = path.read_bytes()
    value = 0
    for s in range(len(data) // SS):
        chunk = data[s * SS:(s + 1) * SS]
        if any(chunk):
            value ^= int.from_bytes(hashlib.blake2b(chunk, digest_size=16, salt=s.to_bytes(16, "little")).digest(), "little")
    return value


def test_images_and_hashes_by_delta_equal_fresh_builds(log: Path, tmp_path: Path) -> None:
    """One image moved state to state (undo + forward replay) equals each state built alone."""
    p = plan(log, ALL_MODES)
    reader = LogReader(str(log))
    hasher = StateHasher(reader, p.entries)
    moving = tmp_path / "moving.img"
    fd = create_file(str(moving), SIZE)
    hashes = {}
    with StateImage(reader, fd) as image:
        for s in p.states():
            image.load(s)
            fresh = tmp_path / "fresh.img"
            build_crash_image(reader, s.id, SIZE, str(fresh))
            assert moving.read_bytes() == fresh.read_bytes(), s.id
            hashes[s.id] = hasher.hash(s)
            assert hashes[s.id] == image_hash(fresh), s.id
    os.close(fd)
    # Same bytes, same hash: dropping a write that a later one repeats, a mark after its write.
    assert hashes["p11-d8"] == hashes["p11"] and hashes["p10"] == hashes["p9"]
    assert hashes["p5-d3"] != hashes["p5"]


def test_hashes_through_whole_device_discards_and_zero_writes(tmp_path: Path) -> None:
    """The base image's hash moves through discards and all-zero writes (mkfs discarding the
    device and zeroing its log) by range, without a step per sector: still the image's hash."""
    path = tmp_path / "zeros.log"
    n = SIZE // SS
    with LogWriter(str(path)) as w:
        w.discard(0, n)                    # 0  mkfs: the whole device
        w.write(0, fill(1, 4096))          # 1
        w.write(16, bytes(8192))           # 2  zeros over nothing
        w.flush()                          # 3
        w.mark("pc:mkfs-done")             # 4
        w.write(40, fill(2, 4096))         # 5
        w.write(0, bytes(1024))            # 6  zeros over part of entry 1
        w.flush()                          # 7
        w.discard(0, n)                    # 8  everything again
        w.write(8, fill(3, 512))           # 9
        w.flush()                          # 10
        w.write(48, fill(4, 512))          # 11
    p = plan(path, "drop-one")
    reader = LogReader(str(path))
    hasher = StateHasher(reader, p.entries)
    fresh = tmp_path / "fresh.img"
    for s in p.states():
        build_crash_image(reader, s.id, SIZE, str(fresh))
        assert hasher.hash(s) == image_hash(fresh), s.id


def test_mark_range_limits_crash_points(log: Path) -> None:
    reader = LogReader(str(log))
    first, last = mark_range(reader, "pc:mkfs-done", "m")
    assert select_crash_points(reader.entries(), "write", first, last) == [3, 4, 5, 7, 8, 9, 10]
    with pytest.raises(UsageError, match="--end-mark 'nope'"):
        mark_range(reader, None, "nope")


@pytest.mark.parametrize("args,message", [
    (["--state", "p5-d9"], "not a droppable write of crash point 5"),
    (["--state", "p5", "--size", "1024"], "--size 1024: the log writes up to byte"),
    (["--state", "p5", "--size", "lots"], "--size 'lots' is not a number"),
])
def test_crash_image_bad_input_is_one_line(log: Path, tmp_path: Path, args: list[str], message: str) -> None:
    argv = ["--log", str(log), "--size", str(SIZE), "--out", str(tmp_path / "x.img"), *args]
    p = subprocess.run([*POWERCUT, "crash-image", *argv], capture_output=True, text=True, cwd=ROOT)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("powercut: ") and message in lines[0], p.stderr


def test_crash_image_refuses_a_file_it_did_not_create(log: Path, tmp_path: Path) -> None:
    mine = tmp_path / "precious.img"
    mine.write_bytes(b"user data")
    p = subprocess.run([*POWERCUT, "crash-image", "--log", str(log), "--state", "p5", "--size", str(SIZE),
                        "--out", str(mine)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "not created by powercut" in p.stderr
    assert mine.read_bytes() == b"user data"
