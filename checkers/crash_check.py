"""Walk the crash points of a log: rebuild each crash image, recover it, fsck it.

Replay is incremental: one replay image advances through the log and each
crash image is a sparse copy of it at that point, so no crash point costs a
replay from entry 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from checkers.findings import Finding
from checkers.recovery import first_problem, recover_and_check
from harness import ownership
from harness.filesystems import FsType
from harness.runstate import RunState
from harness.sparse import sparse_copy
from replay.logformat import LogReader
from replay.replayer import Replayer

Progress = Callable[[int, int, int], None]  # (done, total, findings so far)
# Reads the mounted, recovered crash image at a crash point: (mount dir, crash point) -> findings.
PointInspect = Callable[[str, int], list[Finding]]


@dataclass
class CrashCheckResult:
    states_checked: int = 0
    findings: list[Finding] = field(default_factory=list)


def last_marks(reader: LogReader) -> dict[int, str]:
    """For every entry index, the text of the last mark at or before it (sparse)."""
    return {e.index: e.mark for e in reader.entries() if e.is_mark and e.mark is not None}


def mark_before(marks: dict[int, str], index: int) -> str | None:
    best = None
    for i, text in marks.items():
        if i <= index and (best is None or i > best[0]):
            best = (i, text)
    return best[1] if best else None


def check_crash_points(log_path: str, points: list[int], *, fs: FsType, mount_opts: str,
                       device_bytes: int, state: RunState, progress: Progress | None = None,
                       inspect: PointInspect | None = None) -> CrashCheckResult:
    reader = LogReader(log_path)
    marks = last_marks(reader)
    replay_path = os.path.join(state.scratch, "replay.img")
    crash_path = os.path.join(state.scratch, "crash.img")
    replay_fd = ownership.create_file(replay_path, device_bytes)
    crash_fd = ownership.create_file(crash_path, device_bytes)
    mnt = state.subdir("check-mnt")
    result = CrashCheckResult()
    try:
        replayer = Replayer(reader, replay_fd)
        for n, point in enumerate(points):
            replayer.replay_through(point)
            sparse_copy(replay_path, crash_fd)
            at_point = (lambda m, p=point: inspect(m, p)) if inspect else None
            v = recover_and_check(crash_path, fs, mount_opts, mnt, state, at_point)
            result.states_checked += 1
            where = {"crash_point": point, "crash_mark": mark_before(marks, point)}
            if not v.mount_ok:
                result.findings.append(Finding("mount", f"recovery mount failed: {v.mount_error}", **where,
                                               evidence={"mount_error": v.mount_error}))
            elif v.fsck_failed:
                result.findings.append(Finding("fsck", f"{fs.fsck[0]} exit {v.fsck_code} after recovery: {first_problem(v.fsck_output)}", **where,
                                               evidence={"fsck_code": v.fsck_code, "fsck_output": v.fsck_output[-4000:]}))
            for f in v.content:
                f.crash_mark = where["crash_mark"]
                result.findings.append(f)
            if progress:
                progress(n + 1, len(points), len(result.findings))
    finally:
        os.close(replay_fd)
        os.close(crash_fd)
    return result
