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
from checkers.recovery import HostRecovery, PointInspect, RecoveryEngine, Verdict, first_problem
from harness import ownership
from harness.filesystems import FsType
from harness.runstate import RunState
from replay.logformat import LogReader
from replay.replayer import Replayer

Progress = Callable[[int, int, int], None]  # (done, total, findings so far)


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


def verdict_findings(verdict: Verdict, fs: FsType, point: int, mark: str | None) -> list[Finding]:
    where = {"crash_point": point, "crash_mark": mark}
    found = []
    if not verdict.mount_ok:
        found.append(Finding("mount", f"recovery mount failed: {verdict.mount_error}", **where,
                             evidence={"mount_error": verdict.mount_error}))
    elif verdict.fsck_failed:
        found.append(Finding("fsck", f"{fs.fsck[0]} exit {verdict.fsck_code} after recovery: {first_problem(verdict.fsck_output)}", **where,
                             evidence={"fsck_code": verdict.fsck_code, "fsck_output": verdict.fsck_output[-4000:]}))
    for f in verdict.content:
        f.crash_mark = mark
        found.append(f)
    return found


def check_crash_points(log_path: str, points: list[int], *, fs: FsType, mount_opts: str,
                       device_bytes: int, state: RunState, progress: Progress | None = None,
                       inspect: PointInspect | None = None,
                       engine: RecoveryEngine | None = None) -> CrashCheckResult:
    """ENGINE recovers and checks each crash image; default: the host kernel (HostRecovery),
    which also lets INSPECT read each mounted, recovered image."""
    if engine is not None and inspect is not None:
        raise ValueError("content inspection needs the host recovery engine")
    reader = LogReader(log_path)
    marks = last_marks(reader)
    replay_path = os.path.join(state.scratch, "replay.img")
    replay_fd = ownership.create_file(replay_path, device_bytes)
    engine = engine or HostRecovery(fs, mount_opts, state, device_bytes, inspect)
    result = CrashCheckResult()

    def collect(verdicts: list[tuple[int, Verdict]]) -> None:
        for point, v in verdicts:
            result.states_checked += 1
            result.findings += verdict_findings(v, fs, point, mark_before(marks, point))
        if verdicts and progress:
            progress(result.states_checked, len(points), len(result.findings))

    try:
        replayer = Replayer(reader, replay_fd)
        for point in points:
            replayer.replay_through(point)
            collect(engine.submit(point, replay_path))
        collect(engine.finish())
    finally:
        os.close(replay_fd)
        engine.close()
    return result
