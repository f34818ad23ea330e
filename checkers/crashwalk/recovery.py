"""Let the kernel recover a crash image (mount + umount), then run the real fsck.

fsck runs only after the kernel has replayed the journal/log: fsck on an
unrecovered journaled image reports errors on healthy images (false
positives, see block-recording.md). While the recovered image is mounted,
an optional inspector looks at its content (the content oracle's hook); if
reading fails (the kernel reports corruption: EIO, EUCLEAN, EBADMSG; or a
name just seen is gone, a loop, ...), that is a `corruption` finding with the
path and errno, never a crash of the run, on every backend. A RecoveryEngine does the
recovery somewhere else (the vm backend: the kernel under test in a guest).
"""

from __future__ import annotations

import errno
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from checkers.findings import Finding, is_host_error, read_error
from foundation import kmount, sysres
from foundation.errors import EnvError
from foundation.filesystems import FsType, join_opts
from foundation.holders import holders
from foundation.kmsg import KernelLog
from foundation.loopdev import LoopDevice
from foundation.runstate import RunState

FSCK_TIMEOUT_S = 600
# Reads one mounted, recovered image.
MountInspect = Callable[[str], list[Finding]]
# Reads the mounted image of one crash state: (mount dir, the walk's CrashState).
PointInspect = Callable[[str, Any], list[Finding]]


@dataclass
class Verdict:
    mount_ok: bool
    mount_error: str = ""
    mount_errno: str = ""                                   # e.g. "EUCLEAN"
    kernel_log: list[str] = field(default_factory=list)     # what the kernel logged about the failed mount
    device_waits: list[dict[str, Any]] = field(default_factory=list)  # see mount_for_recovery
    fsck_ran: bool = False
    fsck_code: int = 0
    fsck_failed: bool = False
    fsck_output: str = ""
    fsck_reused: bool = False   # the verdict of an identical recovered image (FsckMemo), fsck not run again
    content: list[Finding] = field(default_factory=list)   # the inspector's findings
    # The kernel reported a bug of its own (panic, oops, BUG, WARNING, hang)
    # while recovering this image: {"event", "line", "console", "phase"}.
    kernel: dict[str, str] | None = None


def inspect_on_loop(loop: LoopDevice, fs: FsType, mnt: str, state: RunState,
                    inspect: MountInspect, *, on_wait: OnWait | None = None,
                    wait_s: float | None = None) -> tuple[list[Finding], list[dict[str, Any]]]:
    """Let INSPECT read the image in LOOP's backing file, already recovered by another kernel:
    (its findings, the waits for a busy device as in Verdict.device_waits).
    LOOP is read-only and the mount too, so the host kernel replays and writes nothing.
    LOOP serves many images (mount and umount are system calls, nothing attached per
    image): the caller rewrote its backing file, so its cached blocks are dropped first.
    A busy device is waited for as for a recovery mount (mount_for_recovery: ON_WAIT, WAIT_S),
    never a finding (seen: EBUSY from a loop device a probe held while three campaigns ran)."""
    loop.drop_caches()
    mount_res = state.record("mount", path=mnt)
    refused = mount_for_recovery(loop, fs, join_opts("ro", fs.recovery_opts), mnt, on_wait=on_wait, wait_s=wait_s)
    waits = refused.device_waits if refused is not None else []
    if refused is not None and not refused.mount_ok:
        state.released(mount_res)
        return [Finding("mount", "read-only host mount of the recovered image (for the content checks) failed: "
                        f"{refused.mount_error}", evidence={"mount_error": refused.mount_error,
                                                            "kernel_log": refused.kernel_log})], waits
    try:
        return guarded_inspect(inspect, mnt), waits
    finally:
        kmount.umount(mnt)
        state.released(mount_res)
        loop.wait_unclaimed()  # the next image's bytes go under it


FSCK_TRIES = 3


def fsck(image: str, fs: FsType) -> tuple[int, str]:
    for _ in range(FSCK_TRIES):
        try:
            code, out, err = sysres.run_to_files(fs.fsck_cmd(image), FSCK_TIMEOUT_S, fs.fsck_env())
        except subprocess.TimeoutExpired:
            return 8, f"{fs.fsck[0]} timed out after {FSCK_TIMEOUT_S}s"
        text = (out + err).strip()
        if code == 0 or not any(m in text for m in fs.fsck_could_not_run):
            return code, text
    # Still not run after FSCK_TRIES: no verdict on the image, so no finding either.
    raise EnvError(f"{fs.fsck[0]} could not check {image}: {first_problem(text)}")


def first_problem(output: str) -> str:
    """The first line of fsck output that is not progress chatter, for summaries."""
    chatter = ("Pass ", "Phase ", "e2fsck ", "Opening", "Checking", "[", "No modify", "- ", "Starting", "UUID", "Fix? no", "IGNORED",
               # xfs_repair on an image file (the vm backend's recovered copy) warns before every run.
               "Cannot get host filesystem geometry", "Repair may fail if there is a sector size mismatch",
               "the image and the host filesystem")
    # Summary counters are recomputed on every check, even of consistent images.
    benign = ("count wrong",)
    lines = [s for s in (line.strip() for line in output.splitlines()) if s and not s.startswith(chatter)]
    serious = [s for s in lines if not any(b in s for b in benign)]
    return (serious or lines or [""])[0]


class FsckVerdicts:
    """fsck verdicts by the content hash of the recovered image they were given (one walk's,
    shared by its workers).

    fsck reads the image and nothing else that changes within a walk (same
    file system, same command), so an image identical to one already checked
    gets that check's exit code and output without running fsck again. A
    worker whose image is being checked by another one right now waits for
    that verdict. Hashing a recovered image costs what the recovery wrote: on
    a file system whose recoveries never leave the same image twice (xfs
    writes 2 MB of log with a new ticket id each time), the walk stops hashing
    once it has hashed GIVE_UP_BYTES without a single repeat; fsck then runs
    for every state, as without a memo.
    """

    GIVE_UP_BYTES = 4 << 20   # xfs: 2 recoveries; ext4 (~50 KB each): ~85

    def __init__(self) -> None:
        self._done: dict[int, tuple[int, str, str]] = {}   # hash -> (code, output, the image path it names)
        self._pending: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.hashed_bytes = 0

    @property
    def worth_hashing(self) -> bool:
        return self.hits > 0 or self.hashed_bytes < self.GIVE_UP_BYTES

    def claim(self, key: int) -> tuple[int, str, str] | None:
        """The verdict for KEY (waiting for one in the making), or None: then the caller runs
        fsck and must call settle() with what it found (or None if it found nothing)."""
        with self._lock:
            if key in self._done:
                self.hits += 1
                return self._done[key]
            event = self._pending.get(key)
            if event is None:
                self._pending[key] = threading.Event()
                return None
        event.wait()
        return self.claim(key)

    def settle(self, key: int, verdict: tuple[int, str, str] | None) -> None:
        with self._lock:
            if verdict is not None:
                self._done[key] = verdict
            event = self._pending.pop(key, None)
        if event is not None:
            event.set()


@dataclass
class FsckMemo:
    """One recovery's way to the walk's FsckVerdicts: KEY gives the hash of the image now on
    the device (called after the unmount), or None when it is not exactly known (fsck runs)."""

    key: Callable[[], int | None]
    verdicts: FsckVerdicts


def fsck_verdict(image: str, fs: FsType, content: list[Finding] | None = None,
                 memo: FsckMemo | None = None) -> Verdict:
    """The verdict on an image the kernel has already recovered."""
    key = memo.key() if memo is not None and memo.verdicts.worth_hashing else None
    known = memo.verdicts.claim(key) if memo is not None and key is not None else None
    if known is None:
        found = None
        try:
            code, out = fsck(image, fs)
            found = (code, out, image)
        finally:
            if memo is not None and key is not None:
                memo.verdicts.settle(key, found)
    else:  # (another worker's image has another name, which fsck prints)
        code, out = known[0], known[1].replace(known[2], image)
    return Verdict(mount_ok=True, fsck_ran=True, fsck_code=code, fsck_failed=fs.fsck_failed(code),
                   fsck_output=out, fsck_reused=known is not None, content=content or [])


def guarded_inspect(inspect: MountInspect, mnt: str) -> list[Finding]:
    """INSPECT's findings on the image mounted at MNT; a read that fails (EBADMSG is
    the kernel's EFSBADCRC, EUCLEAN its EFSCORRUPTED, ...) is a `corruption` finding.
    The content oracle catches these per path itself; this catches what any
    other inspector lets through, so no inspector can crash the run on a bad image."""
    try:
        return inspect(mnt)
    except OSError as e:
        if is_host_error(e):
            raise
        return [read_error(e, mnt)]


# A mount that fails with one of these never got to the file system: the
# device was claimed by someone else (EBUSY: "Can't open blockdev"), gone
# (ENODEV, ENXIO) or the call was interrupted. That is about the harness and
# the machine, never a property of the crash image: wait and mount again.
DEVICE_ERRNOS = {errno.EBUSY, errno.ENODEV, errno.ENXIO, errno.EINTR, errno.EAGAIN}
DEVICE_WAIT_S = 30.0


# Told of each wait for a busy device as it begins (the record gets waited_s when it ends).
OnWait = Callable[[dict[str, Any]], None]


def mount_for_recovery(loop: LoopDevice, fs: FsType, opts: str, mnt: str, *,
                       on_wait: OnWait | None = None, wait_s: float | None = None) -> Verdict | None:
    """Mount LOOP on MNT (the kernel recovers the image); None when mounted, else the
    file system's refusal with the kernel log lines of that mount.

    A refusal for a device reason (DEVICE_ERRNOS) is waited out, bounded and
    logged: wait until nothing claims the device any more, then mount again,
    for at most DEVICE_WAIT_S in all. Each wait goes into the verdict's
    device_waits (what held the device, how long). A device that stays
    unavailable is an environment error of the run, with that evidence.
    """
    waits: list[dict[str, Any]] = []
    wait_s = DEVICE_WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    while True:
        with KernelLog(loop.path) as klog:
            try:
                kmount.mount(loop.path, mnt, fs.name, opts)
                return None if not waits else Verdict(mount_ok=True, device_waits=waits)
            except kmount.MountError as e:
                err, lines = e, klog.lines()
        name = errno.errorcode.get(err.errno, str(err.errno))
        if err.errno not in DEVICE_ERRNOS:
            return Verdict(mount_ok=False, mount_error=str(err), mount_errno=name, kernel_log=lines,
                           device_waits=waits)
        held_by = holders(loop.path).describe()
        wait = {"device": loop.path, "errno": name, "error": str(err), "held_by": held_by, "kernel_log": lines}
        waits.append(wait)
        if on_wait:
            on_wait(wait)
        t0 = time.monotonic()
        free = loop.wait_unclaimed(timeout=max(0.0, deadline - t0), raise_on_timeout=False)
        wait["waited_s"] = round(time.monotonic() - t0, 3)
        if not free or time.monotonic() >= deadline:
            raise EnvError(f"recovery mount of {loop.path} failed with {name} for {wait_s:g}s "
                           f"(a device problem, not a finding): {err}; {held_by}")


def recover_and_check(loop: LoopDevice, fs: FsType, mount_opts: str, mnt: str,
                      inspect: Callable[[str], list[Finding]] | None = None,
                      fsck_memo: FsckMemo | None = None) -> Verdict:
    """Mount LOOP's image (the kernel recovers it), inspect it, unmount, fsck the backing file
    (or take the verdict FSCK_MEMO has for an identical recovered image).

    After the unmount, the device's block cache is written back and dropped
    so that fsck, which reads the file, sees everything the recovery wrote.
    """
    refused = mount_for_recovery(loop, fs, join_opts(mount_opts, fs.recovery_opts), mnt)
    if refused is not None and not refused.mount_ok:
        return refused
    waits = refused.device_waits if refused is not None else []
    try:
        content = guarded_inspect(inspect, mnt) if inspect else []
    finally:
        kmount.umount(mnt)
        loop.wait_unclaimed()
        loop.drop_caches()
    verdict = fsck_verdict(loop.backing, fs, content, fsck_memo)
    verdict.device_waits = waits
    return verdict


class RecoveryEngine(Protocol):
    """Who recovers and checks crash images when the host kernel does not (the vm backend).

    submit() hands over the crash image for KEY, the caller's handle of one
    crash state (the walk passes the CrashState, which the engine also hands
    to its inspector), in a file the caller keeps changing afterwards: copy
    what you need now. It returns the verdicts that are ready, possibly for
    earlier ones too; finish() returns the rest. An engine may batch: the vm
    engine (harness/backends/vm/recovery.py) answers after one guest boot per batch.
    Recovery by the host kernel is the crash walk's own parallel workers
    (checkers/crashwalk/slot.py).
    """

    def submit(self, key: Any, image: str) -> list[tuple[Any, Verdict]]: ...

    def finish(self) -> list[tuple[Any, Verdict]]: ...

    def close(self) -> None: ...
