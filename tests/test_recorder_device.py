"""The fuse backend's recorded device as the harness sets it up: pc-recorder, then a
loop device doing direct I/O on its disk.img (docs/recorder-overhead.md). Requests
sent straight to the block device must reach the log in the order they completed,
flushes included, and the log must replay to the device's final image."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from conftest import PcEnv, assert_log_replays_to, needs_root_stack
from harness.backends.fuse.recorded_device import FuseRecordedDevice
from foundation import runstate
from replay.logformat import LogReader

pytestmark = [pytest.mark.e2e, needs_root_stack]

MiB = 1 << 20


def _direct_write(fd: int, data: bytes, off: int) -> None:
    buf = mmap.mmap(-1, len(data))  # page-aligned, as O_DIRECT wants
    try:
        buf.write(data)
        assert os.pwritev(fd, [buf], off) == len(data)
    finally:
        buf.close()


def test_block_requests_logged_in_completion_order(pc: PcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runstate, "STATE_ROOT", str(pc.state))
    monkeypatch.setattr(runstate, "SCRATCH_ROOT", str(pc.scratch))
    state = runstate.RunState.create("recorder device test")
    log = pc.tmp / "device.log"
    try:
        device = FuseRecordedDevice(state, 16 * MiB, str(log))
        with device:
            dev = Path(device.block_device).name
            assert Path(f"/sys/block/{dev}/loop/dio").read_text().strip() == "1"
            fd = os.open(device.block_device, os.O_RDWR | os.O_DIRECT)
            try:
                _direct_write(fd, b"A" * 4096, 8192)
                os.fsync(fd)
                _direct_write(fd, b"B" * 8192, 65536)
                os.fsync(fd)
            finally:
                os.close(fd)
            device.stop()
            final = device.final_image()
        assert final is not None
        with LogReader(str(log)) as reader:
            ours = [(e.sector, e.nr_sectors, "flush" if e.is_flush else "write")
                    for e in reader.entries() if e.is_flush or (e.is_write and e.sector in (16, 128))]
            # Attaching the loop device sends a flush of its own before ours.
            assert ours[-4:] == [(16, 8, "write"), (0, 0, "flush"), (128, 16, "write"), (0, 0, "flush")]
            assert_log_replays_to(reader, 16 * MiB, Path(final), pc.scratch)
    finally:
        assert state.teardown() == []
