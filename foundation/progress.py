"""Progress for long work: done/total, rate, ETA and findings so far.

A live bar on a terminal (rich); plain periodic lines otherwise (CI logs).
"""

from __future__ import annotations

import sys
import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

PLAIN_EVERY_S = 10.0


class CrashProgress:
    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self._bar: Progress | None = None
        self._task = None
        self._t0 = time.monotonic()
        self._last_line = 0.0

    def __enter__(self) -> "CrashProgress":
        if self.tty:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]:.1f} states/s"), TextColumn("findings: {task.fields[findings]}"),
                                 TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=None, rate=0.0, findings=0)
        return self

    def __call__(self, done: int, total: int, findings: int) -> None:
        elapsed = max(time.monotonic() - self._t0, 1e-6)
        rate = done / elapsed
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done, total=total, rate=rate, findings=findings)
        elif done == total or time.monotonic() - self._last_line >= PLAIN_EVERY_S:
            self._last_line = time.monotonic()
            eta = (total - done) / rate if rate else 0
            print(f"{self.label}: {done}/{total} states, {rate:.1f}/s, ETA {eta:.0f}s, findings {findings}",
                  file=sys.stderr, flush=True)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(et, ev, tb)
