"""Internal errors: a bug in powercut, never a finding (exit 3).

The command prints one line, `powercut: internal error: ...`, and the
traceback goes to a file: OUT/error.txt when the command has an output
directory (a run, a corpus run, a campaign: `note_output_dir` says which),
else a new file in the temporary directory. The line names the file.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback

EXIT_CODE = 3
ERROR_FILE = "error.txt"

_output_dir: str | None = None


def note_output_dir(path: str) -> None:
    """PATH is the command's output directory; the first one noted wins
    (a corpus run's directory, not the directory of one of its cases)."""
    global _output_dir
    if _output_dir is None:
        _output_dir = path


def forget_output_dir() -> None:
    """A new command starts (the CLI entry point calls this)."""
    global _output_dir
    _output_dir = None


def save_traceback(exc: BaseException) -> str:
    """Write EXC's traceback where the module docstring says; return the path."""
    text = "".join(traceback.format_exception(exc))
    if _output_dir is not None and os.path.isdir(_output_dir):
        path = os.path.join(_output_dir, ERROR_FILE)
        try:
            with open(path, "w") as f:
                f.write(text)
            return path
        except OSError:
            pass  # the output directory is what broke: fall back to the temporary directory
    fd, path = tempfile.mkstemp(prefix=f"powercut-error-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def one_line(exc: BaseException, saved_at: str) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    what = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return f"powercut: internal error: {what} (traceback: {saved_at})"
