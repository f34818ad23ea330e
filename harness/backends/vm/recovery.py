"""Crash-image recovery by the kernel under test: many crash images per guest boot.

The host replays the crash images (replay/) and stages them back to back in
one batch disk; one guest boot exposes each with dm-linear, mounts it (the
guest kernel recovers it) and unmounts it (harness/backends/vm/guest/recover.sh).
The host then runs its own fsck on each recovered image and, for a JSON
workload, the content oracle (INSPECT) on a read-only host mount of it: the
guest kernel has already recovered it, so the host kernel replays nothing.
Where the host kernel cannot mount the file system (`guest_reads`: f2fs on a
host without it), the guest also reads each recovered image for the oracle:
it writes the tree to the image's dump region of the batch disk (pc-dump.c)
and the host rebuilds it as a directory the oracle reads instead
(contentdump.py). Batching is what
makes this affordable: a TCG boot costs seconds, a mount a fraction of one.

If the guest kernel dies while mounting an image (a panic, or an oops: the
guest runs with oops=panic) or hangs there (a live guest's watchdog), that
image gets a `kernel` finding with the console excerpt and the rest of the
batch goes to a fresh boot. A kernel WARNING/BUG report on the console
between "pc: mount I" and the next mount is a `kernel` finding of image I.

The guest is either a one-job-per-boot `Guest` (harness/backends/vm/qemu.py) or a
`LiveGuest` (harness/backends/vm/live.py) that serves many batches; both are a
`VmGuest` (harness/backends/vm/guests.py): they give each recovery engine its
batch disk (`batch_disk`, `batch_bytes`) and run the job (`run_job`).
`--recovery both` makes one engine per mode, each with its own batch disk
(engine 0, 1): a live guest has one per mode, so both modes run in it.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

from checkers.findings import Finding
from checkers.crashwalk.recovery import PointInspect, Verdict, fsck_verdict, guarded_inspect, inspect_on_loop
from foundation import kmount, ownership
from foundation.errors import EnvError
from foundation.filesystems import FsType, join_opts
from foundation.loopdev import LoopDevice, recorded_loop
from foundation.runstate import RunState
from foundation.sparse import copy_range
from harness.backends.vm import console as vmconsole
from harness.backends.vm import contentdump
from harness.backends.vm.coverage import RunCoverage, guest_env
from harness.backends.vm.guests import VmGuest
from harness.backends.vm.qemu import Disk, Outcome

# A batch is booted when it holds this many images or this many allocated bytes
# (it lives in the scratch dir, normally tmpfs).
MAX_IMAGES_PER_BOOT = 200
MAX_BATCH_BYTES = 2 << 30
CHECK_THREADS = max(1, min(4, os.cpu_count() or 1))
# The profile of a batch's crash states, in seconds: stage_s, the host's copy of each crash
# image into the batch disk (host -> guest); guest_s, the guest's jobs (linear devices,
# the kernel's recovery mounts and unmounts, under TCG); copy_out_s, each recovered image
# out of the batch disk (guest -> host); fsck_s and content_s, the host's fsck and
# read-only mount + content oracle of it (they run while the guest recovers the next
# images); checks_after_guest_s, the wait for those checks once the guest is done.
PROFILE_KEYS = ("states", "stage_s", "guest_s", "copy_out_s", "fsck_s", "content_s", "checks_after_guest_s")
_MOUNT_LINE = re.compile(r"^pc: mount (\d+)\s*$", re.M)


class VmRecovery:
    def __init__(self, guest: VmGuest, fs: FsType, mount_opts: str, state: RunState, *, timeout: float,
                 inspect: PointInspect | None = None, fault: str | None = None,
                 max_images: int = MAX_IMAGES_PER_BOOT, engine: int = 0, guest_reads: bool = False,
                 coverage: RunCoverage | None = None, profile_sink: dict[str, float] | None = None) -> None:
        self.guest, self.fs, self.state, self.timeout, self.inspect = guest, fs, state, timeout, inspect
        self.coverage = coverage  # the recovery path's kernel coverage goes here (harness/backends/vm/coverage.py)
        # Each image's dump region follows the batch's images: half the slots hold dumps.
        self.dumps = guest_reads and inspect is not None
        self.fault, self.max_images = fault, max(1, max_images // 2) if self.dumps else max_images
        tag = f"-{engine + 1}" if engine else ""  # each engine has its own files
        self.mount_opts = join_opts(mount_opts, fs.recovery_opts)
        self.batch_path, self.batch_device = guest.batch_disk(state, engine)
        self.batch_fd = os.open(self.batch_path, os.O_RDWR)
        self._clear_batch()
        # Host checks of a batch run in parallel (fsck, and the read-only mounts for the
        # inspector, each check file on its own mount point); the inspector one at a time.
        self.check_paths = [os.path.join(state.scratch, f"recovered{tag}-{i}.img") for i in range(CHECK_THREADS)]
        self.check_fds = [ownership.create_file(p) for p in self.check_paths]
        # The content oracle reads each image through a read-only loop device kept per check
        # file (attached at its first image): attaching one per image cost more than the read.
        self.loops: dict[int, LoopDevice] = {}
        self._loop_stack = ExitStack()
        self.mnts = [(self._tree_mount(f"inspect-tree{tag}-{i}") if self.dumps else state.subdir(f"inspect-mnt{tag}-{i}"))
                     if inspect else "" for i in range(CHECK_THREADS)]
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(CHECK_THREADS):
            self._free.put(i)
        self._inspect_lock = threading.Lock()
        self.image_bytes = 0
        self.pending: list[int] = []  # crash point of each staged image, by slot
        # Where a crash state's time goes (seconds summed over states; PROFILE_KEYS), added
        # to PROFILE_SINK (a worker's, over its campaign) when the engine closes.
        self.profile: dict[str, float] = dict.fromkeys(PROFILE_KEYS, 0.0)
        self._profile_sink = profile_sink
        self._profile_lock = threading.Lock()

    def _tree_mount(self, name: str) -> str:
        """A tmpfs of this run's for the tree the guest read of one image: a file there holds
        hundreds of xattrs (ACE's xattrs(foo): 400 x 1 KiB), where the host's ext4 or the
        scratch directory's file system may hold a few KiB (ENOSPC)."""
        mnt = self.state.subdir(name)
        res = self.state.record("mount", path=mnt)
        kmount.mount("powercut-tree", mnt, "tmpfs", "mode=0700")

        def unmount() -> None:
            kmount.umount(mnt)
            self.state.released(res)
        self._loop_stack.callback(unmount)
        return mnt

    def _spent(self, key: str, t0: float) -> None:
        with self._profile_lock:   # (the host checks run in a pool)
            self.profile[key] += time.perf_counter() - t0

    def submit(self, point: int, image: str) -> list[tuple[int, Verdict]]:
        t0 = time.perf_counter()
        with open(image, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            if self.image_bytes not in (0, size) or size % 512:
                raise EnvError(f"{image}: crash image of {size} bytes in a batch of {self.image_bytes}-byte images")
            self.image_bytes = size
            copy_range(src.fileno(), self.batch_fd, 0, size, len(self.pending) * size)
        self.pending.append(point)
        self.profile["states"] += 1
        self._spent("stage_s", t0)
        full = len(self.pending) >= self.max_images or os.fstat(self.batch_fd).st_blocks * 512 >= MAX_BATCH_BYTES
        return self._run_batch() if full else []

    def finish(self) -> list[tuple[int, Verdict]]:
        return self._run_batch() if self.pending else []

    def close(self) -> None:
        if self._profile_sink is not None:
            for k, v in self.profile.items():
                self._profile_sink[k] = round(self._profile_sink.get(k, 0.0) + v, 3)
            self._profile_sink = None
        self._clear_batch()
        os.close(self.batch_fd)
        self._loop_stack.close()
        self.loops.clear()
        for fd in self.check_fds:
            os.close(fd)

    def _loop(self, i: int) -> LoopDevice:
        """Check file I's read-only loop device (its size is the images', fixed from now on)."""
        if i not in self.loops:
            self.loops[i] = self._loop_stack.enter_context(recorded_loop(self.state, self.check_paths[i],
                                                                         read_only=True))
        return self.loops[i]

    def _run_batch(self) -> list[tuple[int, Verdict]]:
        n = len(self.pending)
        os.ftruncate(self.batch_fd, self.guest.batch_bytes((2 if self.dumps else 1) * n * self.image_bytes))
        mounted: dict[int, Verdict | None] = {}  # slot -> None (recovered) or the failure
        kernel: dict[int, dict[str, str]] = {}   # slot -> the kernel's bug report while recovering it
        with ThreadPoolExecutor(CHECK_THREADS) as pool:
            # A live guest answers image by image: the host checks image I while the
            # guest recovers the next ones (the guest has unmounted I: its bytes are final).
            futures: dict[int, Future[Verdict]] = {}

            def recovered(line: str) -> None:
                word, _, rest = line.partition(" ")
                if word == "ok" and rest.isdigit() and int(rest) < n and int(rest) not in futures:
                    futures[int(rest)] = pool.submit(self._check, int(rest), self.pending[int(rest)])

            first = 0
            t0 = time.perf_counter()
            while first < n:
                first = self._boot(first, n, mounted, kernel, recovered)
            self._spent("guest_s", t0)
            t0 = time.perf_counter()
            for slot, point in enumerate(self.pending):
                if mounted[slot] is None and slot not in futures:
                    futures[slot] = pool.submit(self._check, slot, point)
            checked = {slot: f.result() for slot, f in futures.items()}
            self._spent("checks_after_guest_s", t0)
        verdicts = []
        for slot, point in enumerate(self.pending):
            v = mounted[slot] or checked[slot]
            v.kernel = kernel.get(slot)
            verdicts.append((point, v))
        self.pending.clear()
        self._clear_batch()
        return verdicts

    def _clear_batch(self) -> None:
        """Zero the batch disk (a staged image only writes its data extents)."""
        os.ftruncate(self.batch_fd, 0)
        os.ftruncate(self.batch_fd, self.guest.batch_bytes(0))

    def _boot(self, first: int, n: int, mounted: dict[int, Verdict | None], kernel: dict[int, dict[str, str]],
              on_line: Callable[[str], None]) -> int:
        """One guest job over slots FIRST..N-1; returns the first slot it did not finish."""
        env = {"PC_FS": self.fs.name, "PC_MOUNT_OPTS": self.mount_opts, "PC_FIRST": str(first),
               "PC_IMAGES": str(n), "PC_IMAGE_SECTORS": str(self.image_bytes // 512),
               "PC_BATCH_DISK": self.batch_device, **({"PC_FAULT": self.fault} if self.fault else {}),
               **({"PC_DUMP_AT": str(n * self.image_bytes), "PC_DUMP_BYTES": str(self.image_bytes)}
                  if self.dumps else {}),
               **(guest_env(self.fs) if self.coverage is not None else {})}
        outcome = self.guest.run_job("recover", env, [Disk(self.batch_path)], timeout=self.timeout, on_line=on_line)
        if self.coverage is not None:
            self.coverage.add_lines(outcome.lines)
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
            kernel.update(_warnings_by_slot(outcome.console))
            return n
        if begun < first or begun in mounted:
            raise EnvError(f"the recovery guest stopped outside any mount: last console line: {outcome.console_tail}")
        kernel.update(_warnings_by_slot(outcome.console.rsplit(f"pc: mount {begun}", 1)[0]))
        event = outcome.kernel_event("recovery mount")
        assert event is not None
        kernel[begun] = event
        mounted[begun] = Verdict(mount_ok=False, mount_error=f"the guest kernel {event['event']} mounting this image: "
                                                            f"{event['line']}")
        return begun + 1

    def _check(self, slot: int, point: Any) -> Verdict:
        i = self._free.get()
        try:
            path, fd = self.check_paths[i], self.check_fds[i]
            os.ftruncate(fd, 0)
            os.ftruncate(fd, self.image_bytes)
            t0 = time.perf_counter()
            copy_range(self.batch_fd, fd, slot * self.image_bytes, self.image_bytes, 0)
            self._spent("copy_out_s", t0)
            t0 = time.perf_counter()
            verdict = fsck_verdict(path, self.fs)
            self._spent("fsck_s", t0)
            t0 = time.perf_counter()
            if self.inspect is not None:
                inspect, lock = self.inspect, self._inspect_lock

                def one_at_a_time(mnt: str) -> list[Finding]:
                    with lock:
                        return inspect(mnt, point)
                if self.dumps:
                    verdict.content = self._inspect_dump(slot, point, self.mnts[i], one_at_a_time)
                else:
                    verdict.content, verdict.device_waits = inspect_on_loop(self._loop(i), self.fs, self.mnts[i],
                                                                            self.state, one_at_a_time)
                self._spent("content_s", t0)
            return verdict
        finally:
            self._free.put(i)

    def _inspect_dump(self, slot: int, point: Any, root: str, inspect: Callable[[str], list[Finding]]) -> list[Finding]:
        """The oracle on the tree the guest read from image SLOT (crash state POINT), rebuilt under ROOT."""
        at = (len(self.pending) + slot) * self.image_bytes
        failed = contentdump.rebuild(contentdump.read_region(self.batch_fd, at, self.image_bytes), root)
        state_id = getattr(point, "id", None)  # as the oracle labels its own findings
        for f in failed:
            if state_id:
                f.evidence["state_id"] = state_id
        return failed + contentdump.judged_by_failures(guarded_inspect(inspect, root), failed)


def state_profile(seconds: dict[str, float]) -> dict[str, Any]:
    """A VmRecovery.profile (or a sum of them) for a report: the seconds and, per crash
    state, the milliseconds of each part."""
    n = int(seconds.get("states", 0))
    parts = {k.removesuffix("_s"): round(v, 3) for k, v in seconds.items() if k != "states"}
    return {"states": n, "seconds": parts,
            "ms_per_state": {k: round(1000 * v / n, 1) for k, v in parts.items()} if n else {}}


def _warnings_by_slot(text: str) -> dict[int, dict[str, Any]]:
    """Kernel bug reports (WARNING, BUG, ...) in a recovery job's console, by the image being mounted."""
    out: dict[int, dict[str, Any]] = {}
    parts = _MOUNT_LINE.split(text)   # [before, slot, text, slot, text, ...]
    for slot, segment in zip(parts[1::2], parts[2::2]):
        event = vmconsole.first_event(segment)
        if event is not None:
            out[int(slot)] = {"event": event.event, "line": event.line, "console": event.excerpt,
                              "phase": "recovery mount", "rule": f"recovery mount:{event.rule()}"}
    return out
