"""One crash-walk worker's kit: reference image, crash image, loop device, mount point.

The loop device stays attached to the crash image for the worker's whole
life; between crash states only the bytes that differ are rewritten. The
reference image holds the state exactly (built by deltas, never mounted).
After the recovery mount and fsck, the crash image is brought back to the
next state by copying from the reference what may differ: the ranges the
reference moved through (from the log) and every range the kernel wrote to
the device (journal replay, superblock updates, unmount), which a tracepoint
reports (foundation/blockwrites.py). Where that is unavailable or
not sure to be complete, the two images are compared over their data
extents instead, which also undoes whatever the recovery wrote, wherever.
The same accounting tells an inspector what changed on the device since its
previous inspection (checkers/crashwalk/devchanges.py), and gives the hash of the image
the recovery left behind (recovered_hash), so that fsck, which reads nothing
but that image, runs once per distinct recovered image.

Everything is recorded in the run's resource journal before it is created,
so `powercut cleanup` removes it after a kill -9.
"""

from __future__ import annotations

import os
import uuid
from contextlib import ExitStack

from checkers.crashwalk.devchanges import DeviceChanges
from foundation import kmount, ownership
from foundation.blockwrites import WriteTracker, syncfs
from foundation.intervals import merge_ranges
from foundation.loopdev import LoopDevice, recorded_loop
from foundation.runstate import RunState
from foundation.sparse import mirror_range, sync_sparse
from replay.crashstates import CrashState
from replay.logformat import LogReader
from replay.statehash import rewrite_delta
from replay.stateimage import StateImage


class CheckSlot:
    def __init__(self, state: RunState, reader: LogReader, device_bytes: int, name: str,
                 supplied: str | None = None, track: bool = True) -> None:
        self.device_bytes = device_bytes
        self.supplied = supplied  # an image the user brings: every state loads its bytes instead
        self.name = name
        self.image = os.path.join(state.scratch, f"{name}.img")
        self.ref_path = os.path.join(state.scratch, f"{name}-ref.img")   # always exactly the loaded state
        self.mnt = state.subdir(f"mnt-{name}")
        with ExitStack() as stack:
            self.ref = stack.enter_context(StateImage(reader, self._create(stack, f"{name}-ref.img"),
                                                      track_changes=supplied is None and track))
            self._image_fd = self._create(stack, f"{name}.img")
            self.loop = stack.enter_context(recorded_loop(state, self.image, block_size=reader.sectorsize))
            # TRACK: the kernel's writes will be followed (attach_tracker); the reference keeps
            # account of what it moves through meanwhile.
            self.tracker: WriteTracker | None = None
            # One record for every mount on this mount point: the releaser
            # unmounts only if something is still mounted there.
            res = state.record("mount", path=self.mnt)
            stack.callback(state.released, res)
            stack.callback(kmount.umount, self.mnt)
            self._stack = stack.pop_all()
        # Ranges where the crash image may differ from the reference (None: anywhere), and
        # where the device may differ from what the last inspection saw (None: unknown).
        self._dirty: list[tuple[int, int]] | None = None
        self._since_inspect: list[tuple[int, int]] | None = None
        # What the kernel wrote since the last load() (None: unknown), for recovered_hash().
        self._since_load: list[tuple[int, int]] | None = None
        self.hashed_bytes = 0   # what the last recovered_hash() read and compared
        self.sectorsize = reader.sectorsize
        self._token = uuid.uuid4().hex
        self._inspections = 0
        self.restores = {"ranges": 0, "compared": 0}   # how states were loaded (bench, report)

    def attach_tracker(self, tracker: WriteTracker) -> None:
        """Follow the kernel's writes to this slot's device with TRACKER (shared by a walk's
        slots, which owns it), from before the first load on."""
        assert self.ref.changed is not None and self.ref.state is None, "CheckSlot(track=True), before any load"
        self.tracker = tracker
        self._dirty = []

    def _create(self, stack: ExitStack, name: str) -> int:
        fd = ownership.create_file(os.path.join(os.path.dirname(self.image), name), self.device_bytes)
        stack.callback(os.close, fd)
        return fd

    def load(self, cs: CrashState) -> LoopDevice:
        """Make the loop device read exactly crash state CS (or the supplied
        image, copied: it is only ever read); returns it."""
        self.ref.load(cs)
        if self.supplied is not None:
            with open(self.supplied, "rb") as f:
                return self.load_image(f.fileno())
        moved = self.ref.take_changed() if self.ref.changed is not None else []
        self._note_kernel_writes()
        if self._dirty is None:
            sync_sparse(self.ref.fd, self._image_fd, self.device_bytes)
            self._since_inspect = None
            self.restores["compared"] += 1
        else:
            todo = merge_ranges(self._dirty + moved)
            self._copy_from_ref(todo)
            if self._since_inspect is not None:
                self._since_inspect += todo
            self.restores["ranges"] += 1
        self._dirty = [] if self.tracker else None
        # The image is now exactly the state in the reference: from here on, the tracker says what changes.
        self._since_load = [] if self.tracker else None
        # The file changed behind the device's back: its cached blocks are stale.
        self.loop.drop_caches()
        return self.loop

    def load_image(self, fd: int) -> LoopDevice:
        """Make the loop device read exactly the image in FD (a state not of this log)."""
        sync_sparse(fd, self._image_fd, self.device_bytes)
        self.loop.drop_caches()
        # Neither the reference nor an inspector knows this image.
        self._dirty = None
        self._since_inspect = None
        self._since_load = None
        return self.loop

    def _copy_from_ref(self, ranges: list[tuple[int, int]]) -> None:
        for start, end in ranges:
            if start < self.device_bytes:
                mirror_range(self.ref.fd, self._image_fd, start, min(end, self.device_bytes))

    def _note_kernel_writes(self) -> None:
        """Add what the kernel wrote to the device since the last look to both accounts."""
        if self.tracker is None:
            return
        written = self.tracker.drain(self.loop.path)
        if written is None:
            self._dirty = self._since_inspect = self._since_load = None
            return
        if self._dirty is not None:
            self._dirty += written
        if self._since_inspect is not None:
            self._since_inspect += written
        if self._since_load is not None:
            self._since_load += written

    def recovered_hash(self, state_hash: int, chunk: int = 1 << 20) -> int | None:
        """The content hash (replay/statehash.py) of the image after the kernel's recovery,
        or None if not exactly known. STATE_HASH is the hash of the state load() put on the
        device; every range the kernel wrote since then moves it from the reference's bytes
        (still that state) to the image's. Call it once the device is unmounted and written back."""
        self._note_kernel_writes()
        self.hashed_bytes = 0
        if self._since_load is None:
            return None
        ss, value = self.sectorsize, state_hash
        for start, end in merge_ranges(self._since_load):
            start, end = start - start % ss, min(end + (-end) % ss, self.device_bytes)
            self.hashed_bytes += end - start
            for off in range(start, end, chunk):
                n = min(chunk, end - off)
                value ^= rewrite_delta(os.pread(self.ref.fd, n, off), os.pread(self._image_fd, n, off), off // ss, ss)
        return value

    def changes_for_inspection(self, mnt: str) -> DeviceChanges:
        """Before an inspection of the image mounted at MNT: what may differ on the device
        since the previous inspection. Writes back what the recovery left dirty first
        (syncfs), so that file content read through MNT is what the device holds."""
        if self.tracker is not None:
            syncfs(mnt)
            self._note_kernel_writes()
        self._inspections += 1
        ranges = None if self._since_inspect is None else tuple(merge_ranges(self._since_inspect))
        self._since_inspect = [] if self.tracker is not None else None
        return DeviceChanges(self._token, self._inspections, ranges)

    def close(self) -> None:
        self._stack.close()
