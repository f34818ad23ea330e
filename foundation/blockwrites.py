"""Which byte ranges the kernel writes to block devices, from the block layer's tracepoint.

A crash-walk worker moves its loop device from crash state to state. What
differs between two consecutive recovered images is what the log's entries
changed plus what the kernel wrote while recovering (journal replay,
superblock updates, orphan cleanup, the unmount). The log gives the first;
this gives the second, exactly, without comparing images: every bio
submitted to the device passes the `block:block_bio_queue` tracepoint with
its sector range (Documentation/trace/events.rst; the same event blktrace
reads), so a private tracefs instance filtered on the devices' dev_t sees
every write, discard and write-zeroes at submission time (one instance for
all the workers of a walk, each event sorted to its device).

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
import threading
import uuid

from foundation import kmount
from foundation.errors import EnvError
from foundation.intervals import merge_ranges
from foundation.runstate import Resource, RunState

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


class _Device:
    """One traced device's account between two of its drains."""

    def __init__(self, stat_fd: int) -> None:
        self.stat_fd = stat_fd
        self.counted = self.sectors()
        self.ranges: list[tuple[int, int]] = []
        self.traced = 0          # sectors in RANGES
        self.unsure = False      # events may have been lost since the last drain

    def sectors(self) -> int:
        """Sectors written plus discarded, as the device counts them (Documentation/block/stat.rst)."""
        v = [int(x) for x in os.pread(self.stat_fd, 4096, 0).split()]
        return v[6] + (v[13] if len(v) > 13 else 0)


class WriteTracker:
    """Every write to each of DEV_PATHS (block devices) between two drains of that device,
    as merged byte ranges. One tracefs instance serves them all (a crash walk's workers):
    setting an instance up costs a few ms, removing it ~50 ms. drain() may be called from
    several threads; whichever reads the shared pipe sorts the events by device."""

    def __init__(self, state: RunState, dev_paths: list[str], name: str) -> None:
        self._devnums: dict[str, tuple[int, int]] = {}
        for path in dev_paths:
            st = os.stat(path)
            self._devnums[path] = (os.major(st.st_rdev), os.minor(st.st_rdev))
        self._state = state
        self._resources: list[Resource] = []
        self._pipe = -1
        self._fds: list[int] = []
        self._devices: dict[tuple[int, int], _Device] = {}
        self._lock = threading.Lock()
        try:
            self._open(state, name)
        except BaseException:
            self.close()
            raise

    def _open(self, state: RunState, name: str) -> None:
        root = state.subdir(f"tracefs-{name}")
        self._resources.append(state.record("mount", path=root))
        kmount.mount("tracefs", root, "tracefs")
        self.instance = os.path.join(root, "instances", f"powercut-{name}-{uuid.uuid4().hex[:12]}")
        self._resources.append(state.record("trace-instance", path=self.instance))
        os.mkdir(self.instance)
        # (the default ring buffer, ~1.4 MB per CPU, holds tens of thousands of these events;
        # resizing it costs more than a whole crash state)
        event = os.path.join(self.instance, "events", *EVENT)
        devs = sorted(set(self._devnums.values()))
        # Only these devices (the kernel's dev_t layout), and no reads: most bios of a
        # recovery are reads, which change nothing; the kernel drops them before they reach
        # the ring buffer (where the filter is refused, the reader skips them itself).
        ours = " || ".join(f"dev == {major << 20 | minor}" for major, minor in devs)
        try:
            _write(os.path.join(event, "filter"), f"({ours}) && !(rwbs ~ \"R*\")")
        except OSError:
            _write(os.path.join(event, "filter"), ours)
        _write(os.path.join(event, "enable"), "1")
        self._pipe = os.open(os.path.join(self.instance, "trace_pipe"), os.O_RDONLY | os.O_NONBLOCK)
        # Kept open and re-read with pread: opening them at every drain costs more than the rest.
        per_cpu = os.path.join(self.instance, "per_cpu")
        self._fds = [os.open(os.path.join(per_cpu, cpu, "stats"), os.O_RDONLY) for cpu in sorted(os.listdir(per_cpu))]
        self._ring_fds = list(self._fds)
        for major, minor in devs:
            fd = os.open(f"/sys/dev/block/{major}:{minor}/stat", os.O_RDONLY)
            self._fds.append(fd)
            self._devices[(major, minor)] = _Device(fd)
        self._lost = self._ring_losses()

    def _ring_losses(self) -> int:
        total = 0
        for fd in self._ring_fds:
            for line in os.pread(fd, 4096, 0).decode().splitlines():
                key, _, value = line.partition(":")
                if key.strip() in ("overrun", "commit overrun", "dropped events"):
                    total += int(value.split()[0])
        return total

    def _read_events(self) -> None:
        """Move what the pipe holds into the devices' accounts (self._lock held)."""
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
        lost = self._ring_losses()
        if lost != self._lost or b"LOST" in raw:  # whose events were lost is unknown: everyone's
            for dev in self._devices.values():
                dev.unsure = True
        self._lost = lost
        for m in _LINE.finditer(raw):
            rwbs, sector, n = m.group(3).lstrip(b"F"), int(m.group(4)), int(m.group(5))
            if n == 0 or rwbs.startswith(b"R"):
                continue  # reads, and flushes without data, change nothing
            dev = self._devices.get((int(m.group(1)), int(m.group(2))))
            if dev is not None:
                dev.ranges.append((sector * _SECTOR, (sector + n) * _SECTOR))
                dev.traced += n

    def drain(self, dev_path: str) -> list[tuple[int, int]] | None:
        """Byte ranges (start, end) written to DEV_PATH since its last drain, merged; None if
        some may be missing."""
        dev = self._devices[self._devnums[dev_path]]
        with self._lock:
            self._read_events()
            counted = dev.sectors()
            sure = not dev.unsure and counted - dev.counted <= dev.traced
            ranges = merge_ranges(dev.ranges) if sure else None
            dev.counted, dev.ranges, dev.traced, dev.unsure = counted, [], 0, False
        return ranges

    def close(self) -> None:
        for fd in self._fds + ([self._pipe] if self._pipe >= 0 else []):
            os.close(fd)
        self._fds, self._pipe = [], -1
        for res in reversed(self._resources):
            self._state.release(res)
        self._resources = []


def open_tracker(state: RunState, dev_paths: list[str], name: str) -> WriteTracker | None:
    """A WriteTracker for DEV_PATHS, or None where this kernel or machine has no block tracepoints
    (then callers compare images instead). POWERCUT_NO_WRITE_TRACKING=1 turns it off."""
    if os.environ.get("POWERCUT_NO_WRITE_TRACKING") == "1":
        return None
    try:
        return WriteTracker(state, dev_paths, name)
    except (OSError, EnvError, kmount.MountError):  # no tracefs, no block events, no permission: compare instead
        return None
