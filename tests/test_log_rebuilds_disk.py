"""A vm recording is trusted only if its log rebuilds the guest's data disk byte for byte.

A live guest reuses its disks and kernel from case to case; the check
(harness/backends/vm/backend.py `check_log_rebuilds_disk`) is what separates
the kernel's own behaviour from state an earlier case left on the disk or
writes the log missed. Real logs (LogWriter's format) and sparse images.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.backends.vm.backend import check_log_rebuilds_disk
from foundation import ownership
from foundation.errors import EnvError
from replay.logformat import LogReader, LogWriter
from replay.replayer import log_differs_from

DEVICE = 1 << 20


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "rec.log"
    with LogWriter(str(path)) as w:
        w.write(0, b"\x01" * 4096)
        w.flush()
        w.write(200, b"\x02" * 8192)
        w.discard(200, 8)          # zeroes the first 4 KiB of that write
        w.mark("end")
    return path


def disk(tmp_path: Path, writes: list[tuple[int, bytes]]) -> str:
    path = str(tmp_path / "disk.img")
    fd = ownership.create_file(path, DEVICE)
    try:
        for offset, data in writes:
            os.pwrite(fd, data, offset)
    finally:
        os.close(fd)
    return path


FAITHFUL = [(0, b"\x01" * 4096), (200 * 512 + 4096, b"\x02" * 4096)]


def test_a_disk_the_log_rebuilds_passes(tmp_path: Path, log: Path) -> None:
    image = disk(tmp_path, FAITHFUL)
    with LogReader(str(log)) as reader:
        assert log_differs_from(reader, image, str(tmp_path / "scratch.img")) is None
    check_log_rebuilds_disk(str(log), image, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["disk.img", "rec.log"]  # the replay scratch is gone


@pytest.mark.parametrize("writes,where", [
    (FAITHFUL + [(600 * 1024, b"stale")], 576 * 1024),     # bytes an earlier case left behind
    (FAITHFUL[:1], 64 * 1024),                             # a write the disk never got
    (FAITHFUL + [(200 * 512, b"\x02")], 64 * 1024),        # the discarded range not zero
])
def test_a_disk_the_log_does_not_rebuild_is_an_error(tmp_path: Path, log: Path,
                                                      writes: list[tuple[int, bytes]], where: int) -> None:
    image = disk(tmp_path, writes)
    with LogReader(str(log)) as reader:
        assert log_differs_from(reader, image, str(tmp_path / "scratch.img")) == where
    with pytest.raises(EnvError, match=f"differ in the 64 KiB at byte {where}"):
        check_log_rebuilds_disk(str(log), image, str(tmp_path))
