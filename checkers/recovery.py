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

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from checkers.findings import Finding, is_host_error, read_error
from harness.foundation import kmount, sysres
from harness.foundation.filesystems import FsType, join_opts
from harness.foundation.loopdev import LoopDevice

FSCK_TIMEOUT_S = 600
# Reads one mounted, recovered image.
MountInspect = Callable[[str], list[Finding]]
# Reads the mounted image of one crash state: (mount dir, the walk's CrashState).
PointInspect = Callable[[str, Any], list[Finding]]


@dataclass
class Verdict:
    mount_ok: bool
    mount_error: str = ""
    fsck_ran: bool = False
    fsck_code: int = 0
    fsck_failed: bool = False
    fsck_output: str = ""
    content: list[Finding] = field(default_factory=list)   # the inspector's findings


def inspect_read_only(image: str, fs: FsType, mnt: str, state: RunState, inspect: MountInspect) -> list[Finding]:
    """Let INSPECT read IMAGE, already recovered by another kernel: a read-only
    loop device and a read-only mount, so the host kernel replays and writes nothing."""
    loop_res = state.record("loop", backing=image)
    try:
        dev = sysres.loop_attach(image, read_only=True)
        mount_res = state.record("mount", path=mnt)
        p = sysres.mount(dev, mnt, fs.name, join_opts("ro", fs.recovery_opts))
        if p.returncode != 0:
            state.released(mount_res)
            err = (p.stderr or p.stdout).strip()
            return [Finding("mount", f"read-only host mount of the recovered image (for the content checks) failed: {err}",
                            evidence={"mount_error": err})]
        try:
            return guarded_inspect(inspect, mnt)
        finally:
            state.release(mount_res)
    finally:
        state.release(loop_res)


def fsck(image: str, fs: FsType) -> tuple[int, str]:
    try:
        p = subprocess.run(fs.fsck_cmd(image), capture_output=True, text=True, timeout=FSCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return 8, f"{fs.fsck[0]} timed out after {FSCK_TIMEOUT_S}s"
    return p.returncode, (p.stdout + p.stderr).strip()


def first_problem(output: str) -> str:
    """The first line of fsck output that is not progress chatter, for summaries."""
    chatter = ("Pass ", "Phase ", "e2fsck ", "Opening", "Checking", "[", "No modify", "- ", "Starting", "UUID", "Fix? no", "IGNORED")
    # Summary counters are recomputed on every check, even of consistent images.
    benign = ("count wrong",)
    lines = [s for s in (line.strip() for line in output.splitlines()) if s and not s.startswith(chatter)]
    serious = [s for s in lines if not any(b in s for b in benign)]
    return (serious or lines or [""])[0]


def fsck_verdict(image: str, fs: FsType, content: list[Finding] | None = None) -> Verdict:
    """The verdict on an image the kernel has already recovered."""
    code, out = fsck(image, fs)
    return Verdict(mount_ok=True, fsck_ran=True, fsck_code=code, fsck_failed=fs.fsck_failed(code),
                   fsck_output=out, content=content or [])


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


def recover_and_check(loop: LoopDevice, fs: FsType, mount_opts: str, mnt: str,
                      inspect: Callable[[str], list[Finding]] | None = None) -> Verdict:
    """Mount LOOP's image (the kernel recovers it), inspect it, unmount, fsck the backing file.

    After the unmount, the device's block cache is written back and dropped
    so that fsck, which reads the file, sees everything the recovery wrote.
    """
    try:
        kmount.mount(loop.path, mnt, fs.name, join_opts(mount_opts, fs.recovery_opts))
    except kmount.MountError as e:
        return Verdict(mount_ok=False, mount_error=str(e))
    try:
        content = guarded_inspect(inspect, mnt) if inspect else []
    finally:
        kmount.umount(mnt)
        loop.wait_unclaimed()
        loop.drop_caches()
    return fsck_verdict(loop.backing, fs, content)


class RecoveryEngine(Protocol):
    """Who recovers and checks crash images when the host kernel does not (the vm backend).

    submit() hands over the crash image for KEY, the caller's handle of one
    crash state (the walk passes the CrashState, which the engine also hands
    to its inspector), in a file the caller keeps changing afterwards: copy
    what you need now. It returns the verdicts that are ready, possibly for
    earlier ones too; finish() returns the rest. An engine may batch: the vm
    engine (harness/backends/vm/recovery.py) answers after one guest boot per batch.
    Recovery by the host kernel is the crash walk's own parallel workers
    (checkers/checkslot.py).
    """

    def submit(self, key: Any, image: str) -> list[tuple[Any, Verdict]]: ...

    def finish(self) -> list[tuple[Any, Verdict]]: ...

    def close(self) -> None: ...
