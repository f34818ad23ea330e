"""Which byte ranges the kernel writes to one block device, from the block layer's tracepoint.

A crash-walk worker moves its loop device from crash state to state. What
differs between two consecutive recovered images is what the log's entries
changed plus what the kernel wrote while recovering (journal replay,
superblock updates, orphan cleanup, the unmount). The log gives the first;
this gives the second, exactly, without comparing images: every bio
submitted to the device passes the `block:block_bio_queue` tracepoint with
its sector range (Documentation/trace/events.rst; the same event blktrace
reads), so a private tracefs instance filtered on the device's dev_t sees
every write, discard and write-zeroes at submission time.

drain() returns None (the caller must then compare or reread everything)
whenever it cannot be sure it saw every write: the ring buffer overran or
dropped events, the reader saw a LOST EVENTS marker, or the device's own
counters (/sys/dev/block/M:m/stat, written + discarded sectors, counted at
completion) show more sectors than were traced (a bio split is traced twice,
so the traced sum may exceed the counter, never fall short of it).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import uuid

from harness.foundation import kmount
from harness.foundation.errors import EnvError
from harness.foundation.intervals import merge_ranges
from harness.foundation.runstate import Resource, RunState

EVENT = ("block", "block_bio_queue")
_LINE = re.compile(rb"block_bio_queue: (\d+),(\d+) (\S+) (\d+) \+ (\d+)")
_SECTOR = 512                           # tracepoint sectors are always 512 bytes

_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(path: str) -> None:
    """syncfs(2) on the file system mounted at PATH: its dirty data and metadata reach the device."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"syncfs {path}: {os.strerror(e)}")
    finally:
        os.close(fd)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class WriteTracker:
    """Every write to DEV_PATH (a block device) between drains, as merged byte ranges."""

    def __init__(self, state: RunState, dev_path: str, name: str) -> None:
        st = os.stat(dev_path)
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        self._stat_path = f"/sys/dev/block/{major}:{minor}/stat"
        self._state = state
        self._resources: list[Resource] = []
        self._pipe = -1
        self._fds: list[int] = []
        try:
            self._open(state, major, minor, name)
        except BaseException:
            self.close()
            raise

    def _open(self, state: RunState, major: int, minor: int, name: str) -> None:
        root = state.subdir(f"tracefs-{name}")
        self._resources.append(state.record("mount", path=root))
        kmount.mount("tracefs", root, "tracefs")
        self.instance = os.path.join(root, "instances", f"powercut-{name}-{uuid.uuid4().hex[:12]}")
        self._resources.append(state.record("trace-instance", path=self.instance))
        os.mkdir(self.instance)
        # (the default ring buffer, ~1.4 MB per CPU, holds tens of thousands of these events;
        # resizing it costs more than a whole crash state)
        event = os.path.join(self.instance, "events", *EVENT)
        _write(os.path.join(event, "filter"), f"dev == {major << 20 | minor}")  # the kernel's dev_t layout
        _write(os.path.join(event, "enable"), "1")
        self._pipe = os.open(os.path.join(self.instance, "trace_pipe"), os.O_RDONLY | os.O_NONBLOCK)
        # Kept open and re-read with pread: opening them at every drain costs more than the rest.
        per_cpu = os.path.join(self.instance, "per_cpu")
        self._fds = [os.open(os.path.join(per_cpu, cpu, "stats"), os.O_RDONLY) for cpu in sorted(os.listdir(per_cpu))]
        self._stat_fd = os.open(self._stat_path, os.O_RDONLY)
        self._fds.append(self._stat_fd)
        self._counted = self._device_sectors()
        self._lost = self._ring_losses()

    def _device_sectors(self) -> int:
        """Sectors written plus discarded, as the device counts them (Documentation/block/stat.rst)."""
        v = [int(x) for x in os.pread(self._stat_fd, 4096, 0).split()]
        return v[6] + (v[13] if len(v) > 13 else 0)

    def _ring_losses(self) -> int:
        total = 0
        for fd in self._fds[:-1]:
            for line in os.pread(fd, 4096, 0).decode().splitlines():
                key, _, value = line.partition(":")
                if key.strip() in ("overrun", "commit overrun", "dropped events"):
                    total += int(value.split()[0])
        return total

    def drain(self) -> list[tuple[int, int]] | None:
        """Byte ranges (start, end) written since the last drain, merged; None if some may be missing."""
        raw = bytearray()
        while True:
            try:
                got = os.read(self._pipe, 1 << 16)
            except OSError as e:
                if e.errno == errno.EAGAIN:
                    break
                raise
            if not got:
                break
            raw += got
        counted, lost = self._device_sectors(), self._ring_losses()
        sure = lost == self._lost and b"LOST" not in raw
        ranges, traced = [], 0
        for m in _LINE.finditer(raw):
            rwbs, sector, n = m.group(3).lstrip(b"F"), int(m.group(4)), int(m.group(5))
            if n == 0 or rwbs.startswith(b"R"):
                continue  # reads, and flushes without data, change nothing
            ranges.append((sector * _SECTOR, (sector + n) * _SECTOR))
            traced += n
        sure = sure and counted - self._counted <= traced
        self._counted, self._lost = counted, lost
        return merge_ranges(ranges) if sure else None

    def close(self) -> None:
        for fd in self._fds + ([self._pipe] if self._pipe >= 0 else []):
            os.close(fd)
        self._fds, self._pipe = [], -1
        for res in reversed(self._resources):
            self._state.release(res)
        self._resources = []


def open_tracker(state: RunState, dev_path: str, name: str) -> WriteTracker | None:
    """A WriteTracker for DEV_PATH, or None where this kernel or machine has no block tracepoints
    (then callers compare images instead). POWERCUT_NO_WRITE_TRACKING=1 turns it off."""
    if os.environ.get("POWERCUT_NO_WRITE_TRACKING") == "1":
        return None
    try:
        return WriteTracker(state, dev_path, name)
    except (OSError, EnvError, kmount.MountError):  # no tracefs, no block events, no permission: compare instead
        return None
