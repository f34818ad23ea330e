"""Crash-image recovery by the kernel under test: many crash images per guest boot.

The host replays the crash images (replay/) and stages them back to back in
one batch disk; one guest boot exposes each with dm-linear, mounts it (the
guest kernel recovers it) and unmounts it (harness/backends/vm/guest/recover.sh).
The host then runs its own fsck on each recovered image and, for a JSON
workload, the content oracle (INSPECT) on a read-only host mount of it: the
guest kernel has already recovered it, so the host kernel replays nothing. Batching is what
makes this affordable: a TCG boot costs seconds, a mount a fraction of one.

If the guest kernel dies while mounting an image (a panic, or an oops: the
guest runs with oops=panic), that image gets a `mount` finding and the rest
of the batch goes to a fresh boot.
"""

from __future__ import annotations

import os

from checkers.recovery import PointInspect, Verdict, fsck_verdict, inspect_read_only
from harness.foundation import ownership
from harness.foundation.errors import EnvError
from harness.foundation.filesystems import FsType, join_opts
from harness.foundation.runstate import RunState
from harness.foundation.sparse import copy_range
from harness.backends.vm.qemu import Disk, Guest

# A batch is booted when it holds this many images or this many allocated bytes
# (it lives in the scratch dir, normally tmpfs).
MAX_IMAGES_PER_BOOT = 200
MAX_BATCH_BYTES = 2 << 30


class VmRecovery:
    def __init__(self, guest: Guest, fs: FsType, mount_opts: str, state: RunState, *, timeout: float,
                 inspect: PointInspect | None = None) -> None:
        self.guest, self.fs, self.state, self.timeout, self.inspect = guest, fs, state, timeout, inspect
        self.mnt = state.subdir("inspect-mnt") if inspect else ""
        self.mount_opts = join_opts(mount_opts, fs.recovery_opts)
        self.batch_path = os.path.join(state.scratch, "recovery-batch.img")
        self.batch_fd = ownership.create_file(self.batch_path)
        self.check_path = os.path.join(state.scratch, "recovered.img")
        self.check_fd = ownership.create_file(self.check_path)
        self.image_bytes = 0
        self.pending: list[int] = []  # crash point of each staged image, by slot

    def submit(self, point: int, image: str) -> list[tuple[int, Verdict]]:
        with open(image, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            if self.image_bytes not in (0, size) or size % 512:
                raise EnvError(f"{image}: crash image of {size} bytes in a batch of {self.image_bytes}-byte images")
            self.image_bytes = size
            copy_range(src.fileno(), self.batch_fd, 0, size, len(self.pending) * size)
        self.pending.append(point)
        full = len(self.pending) >= MAX_IMAGES_PER_BOOT or os.fstat(self.batch_fd).st_blocks * 512 >= MAX_BATCH_BYTES
        return self._run_batch() if full else []

    def finish(self) -> list[tuple[int, Verdict]]:
        return self._run_batch() if self.pending else []

    def close(self) -> None:
        os.close(self.batch_fd)
        os.close(self.check_fd)

    def _run_batch(self) -> list[tuple[int, Verdict]]:
        n = len(self.pending)
        os.ftruncate(self.batch_fd, n * self.image_bytes)  # the guest sees exactly n images
        mounted: dict[int, Verdict | None] = {}  # slot -> None (recovered) or the failure
        first = 0
        while first < n:
            first = self._boot(first, n, mounted)
        verdicts = [(point, mounted[slot] or self._check(slot, point)) for slot, point in enumerate(self.pending)]
        self.pending.clear()
        os.ftruncate(self.batch_fd, 0)
        return verdicts

    def _boot(self, first: int, n: int, mounted: dict[int, Verdict | None]) -> int:
        """One guest boot over slots FIRST..N-1; returns the first slot it did not finish."""
        env = {"PC_FS": self.fs.name, "PC_MOUNT_OPTS": self.mount_opts, "PC_FIRST": str(first),
               "PC_IMAGES": str(n), "PC_IMAGE_SECTORS": str(self.image_bytes // 512)}
        outcome = self.guest.boot("recover", env, [Disk(self.batch_path)], timeout=self.timeout)
        begun = first - 1
        for line in outcome.lines:
            word, slot, msg = (line.split(" ", 2) + ["", ""])[:3]
            if word == "begin":
                begun = int(slot)
            elif word == "ok":
                mounted[int(slot)] = None
            elif word == "fail":
                mounted[int(slot)] = Verdict(mount_ok=False, mount_error=msg)
        if outcome.completed:
            missing = [s for s in range(first, n) if s not in mounted]
            if missing:
                raise EnvError(f"the recovery guest reported no result for image {missing[0]}")
            return n
        if begun < first or begun in mounted:
            raise EnvError(f"the recovery guest stopped outside any mount: last console line: {outcome.console_tail}")
        mounted[begun] = Verdict(mount_ok=False, mount_error=f"the guest kernel died mounting this image: {outcome.console_tail}")
        return begun + 1

    def _check(self, slot: int, point: int) -> Verdict:
        os.ftruncate(self.check_fd, 0)
        os.ftruncate(self.check_fd, self.image_bytes)
        copy_range(self.batch_fd, self.check_fd, slot * self.image_bytes, self.image_bytes, 0)
        verdict = fsck_verdict(self.check_path, self.fs)
        if self.inspect is not None:
            inspect = self.inspect
            verdict.content = inspect_read_only(self.check_path, self.fs, self.mnt, self.state,
                                                lambda mnt: inspect(mnt, point))
        return verdict
