"""Let the kernel recover a crash image (mount + umount), then run the real fsck.

fsck runs only after the kernel has replayed the journal/log: fsck on an
unrecovered journaled image reports errors on healthy images (false
positives, see block-recording.md).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from checkers.findings import Finding
from harness import ownership, sysres
from harness.filesystems import FsType, join_opts
from harness.runstate import RunState
from harness.sparse import sparse_copy

FSCK_TIMEOUT_S = 600


@dataclass
class Verdict:
    mount_ok: bool
    mount_error: str = ""
    fsck_ran: bool = False
    fsck_code: int = 0
    fsck_failed: bool = False
    fsck_output: str = ""
    content: list[Finding] = field(default_factory=list)


Inspect = Callable[[str], list[Finding]]


def recover(image: str, fs: FsType, mount_opts: str, mnt: str, state: RunState,
            inspect: Inspect | None = None) -> tuple[bool, str, list[Finding]]:
    """Attach IMAGE, mount it (journal recovery by the kernel), let INSPECT
    read the recovered files, unmount, detach."""
    loop_res = state.record("loop", backing=image)
    try:
        dev = sysres.loop_attach(image)
        mount_res = state.record("mount", path=mnt)
        p = sysres.mount(dev, mnt, fs.name, join_opts(mount_opts, fs.recovery_opts))
        if p.returncode != 0:
            state.released(mount_res)
            return False, (p.stderr or p.stdout).strip(), []
        try:
            found = inspect(mnt) if inspect else []
        finally:
            state.release(mount_res)
        return True, "", found
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


def recover_and_check(image: str, fs: FsType, mount_opts: str, mnt: str, state: RunState,
                      inspect: Inspect | None = None) -> Verdict:
    ok, err, found = recover(image, fs, mount_opts, mnt, state, inspect)
    if not ok:
        return Verdict(mount_ok=False, mount_error=err)
    return fsck_verdict(image, fs, found)


class RecoveryEngine(Protocol):
    """Who recovers and checks crash images for the crash-point walk.

    submit() hands over the crash image for POINT (a file the caller keeps
    changing afterwards: copy what you need now) and returns the verdicts
    that are ready, possibly for earlier points too; finish() returns the
    rest. An engine may batch: the host engine answers at once, the vm engine
    (checkers/vm_recovery.py) after one guest boot per batch.
    """

    def submit(self, point: int, image: str) -> list[tuple[int, Verdict]]: ...

    def finish(self) -> list[tuple[int, Verdict]]: ...

    def close(self) -> None: ...


# Reads the mounted, recovered crash image at a crash point: (mount dir, crash point) -> findings.
PointInspect = Callable[[str, int], list[Finding]]


class HostRecovery:
    """Recovery by the host's kernel, one crash image at a time on a loop device."""

    def __init__(self, fs: FsType, mount_opts: str, state: RunState, device_bytes: int,
                 inspect: PointInspect | None = None) -> None:
        self.fs, self.mount_opts, self.state, self.inspect = fs, mount_opts, state, inspect
        self.crash_path = os.path.join(state.scratch, "crash.img")
        self.crash_fd = ownership.create_file(self.crash_path, device_bytes)
        self.mnt = state.subdir("check-mnt")

    def submit(self, point: int, image: str) -> list[tuple[int, Verdict]]:
        sparse_copy(image, self.crash_fd)  # recovery writes to the image: never to the replay target
        at_point = (lambda m: self.inspect(m, point)) if self.inspect else None
        return [(point, recover_and_check(self.crash_path, self.fs, self.mount_opts, self.mnt, self.state, at_point))]

    def finish(self) -> list[tuple[int, Verdict]]:
        return []

    def close(self) -> None:
        os.close(self.crash_fd)
