"""The live status line of a campaign: a refreshing line on a terminal
(rich), plain lines every PLAIN_EVERY_S otherwise (CI logs)."""

from __future__ import annotations

import sys
import time
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.text import Text

PLAIN_EVERY_S = 15.0


def clock(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class StatusLine:
    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self._live: Live | None = None
        self._last = 0.0
        self._text = ""

    def __enter__(self) -> "StatusLine":
        if self.tty:
            self._live = Live(Text(""), console=Console(stderr=True), refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def show(self, text: str, force: bool = False) -> None:
        self._text = text
        if self._live is not None:
            self._live.update(Text(text))
        elif force or time.monotonic() - self._last >= PLAIN_EVERY_S:
            self._last = time.monotonic()
            print(text, file=sys.stderr, flush=True)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(et, ev, tb)
        else:
            print(self._text, file=sys.stderr, flush=True)
