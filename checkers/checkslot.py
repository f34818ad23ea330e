"""One crash-walk worker's kit: reference image, crash image, loop device, mount point.

The loop device stays attached to the crash image for the worker's whole
life; between crash states only the bytes that differ are rewritten. The
reference image holds the state exactly (built by deltas, never mounted);
after the recovery mount and fsck, the crash image is brought back to the
next state by comparing it with the reference over their data extents, which
also undoes whatever the recovery wrote (journal replay, superblock
updates), wherever it wrote it.

Everything is recorded in the run's resource journal before it is created,
so `powercut cleanup` removes it after a kill -9.
"""

from __future__ import annotations

import os

from harness import kmount, ownership
from harness.loopdev import LoopDevice
from harness.runstate import Resource, RunState
from harness.sparse import sync_sparse
from replay.crashstates import CrashState
from replay.logformat import LogReader
from replay.stateimage import StateImage


class CheckSlot:
    def __init__(self, state: RunState, reader: LogReader, device_bytes: int, name: str) -> None:
        self.device_bytes = device_bytes
        self._run = state
        self._fds: list[int] = []
        self._res: list[Resource] = []
        self.ref: StateImage | None = None
        self.loop: LoopDevice | None = None
        self.image = os.path.join(state.scratch, f"{name}.img")
        self.mnt = state.subdir(f"mnt-{name}")
        try:
            self.ref = StateImage(reader, self._create(os.path.join(state.scratch, f"{name}-ref.img")))
            self._image_fd = self._create(self.image)
            self._res.append(state.record("loop", backing=os.path.realpath(self.image)))
            self.loop = LoopDevice(self.image, block_size=reader.sectorsize)
            # One record for every mount on this mount point: the releaser
            # unmounts only if something is still mounted there.
            self._res.append(state.record("mount", path=self.mnt))
        except BaseException:
            self.close()
            raise

    def _create(self, path: str) -> int:
        fd = ownership.create_file(path, self.device_bytes)
        self._fds.append(fd)
        return fd

    def load(self, cs: CrashState) -> LoopDevice:
        """Make the loop device read exactly crash state CS; returns it."""
        assert self.ref is not None and self.loop is not None
        self.ref.load(cs)
        sync_sparse(self.ref.fd, self._image_fd, self.device_bytes)
        # The file changed behind the device's back: its cached blocks are stale.
        self.loop.drop_caches()
        return self.loop

    def close(self) -> None:
        for res in reversed(self._res):
            if res.kind == "mount":
                kmount.umount(self.mnt)
            elif self.loop is not None:
                self.loop.close()
            self._run.released(res)
        self._res.clear()
        if self.ref is not None:
            self.ref.close()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
