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
from contextlib import ExitStack

from harness.foundation import kmount, ownership
from harness.foundation.loopdev import LoopDevice, recorded_loop
from harness.foundation.runstate import RunState
from harness.foundation.sparse import sync_sparse
from replay.crashstates import CrashState
from replay.logformat import LogReader
from replay.stateimage import StateImage


class CheckSlot:
    def __init__(self, state: RunState, reader: LogReader, device_bytes: int, name: str,
                 supplied: str | None = None) -> None:
        self.device_bytes = device_bytes
        self.supplied = supplied  # an image the user brings: every state loads its bytes instead
        self.name = name
        self.image = os.path.join(state.scratch, f"{name}.img")
        self.ref_path = os.path.join(state.scratch, f"{name}-ref.img")   # always exactly the loaded state
        self.mnt = state.subdir(f"mnt-{name}")
        with ExitStack() as stack:
            self.ref = stack.enter_context(StateImage(reader, self._create(stack, f"{name}-ref.img")))
            self._image_fd = self._create(stack, f"{name}.img")
            self.loop = stack.enter_context(recorded_loop(state, self.image, block_size=reader.sectorsize))
            # One record for every mount on this mount point: the releaser
            # unmounts only if something is still mounted there.
            res = state.record("mount", path=self.mnt)
            stack.callback(state.released, res)
            stack.callback(kmount.umount, self.mnt)
            self._stack = stack.pop_all()

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
        sync_sparse(self.ref.fd, self._image_fd, self.device_bytes)
        # The file changed behind the device's back: its cached blocks are stale.
        self.loop.drop_caches()
        return self.loop

    def load_image(self, fd: int) -> LoopDevice:
        """Make the loop device read exactly the image in FD (a state not of this log)."""
        sync_sparse(fd, self._image_fd, self.device_bytes)
        self.loop.drop_caches()
        return self.loop

    def close(self) -> None:
        self._stack.close()
