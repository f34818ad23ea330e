"""Ways to run a workload on the mounted file system under test.

`ExternalProgram` runs any executable (a shell or Python script, the user's
own application) with the mount as its working directory, ALICE-style; it
may add marks by writing to $POWERCUT_MARK_FILE (one write = one mark).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Protocol

from harness.errors import UsageError
from harness.runstate import RunState, record_process

INTERPRETERS = {".sh": ["bash"], ".py": [sys.executable]}


class WorkloadRunner(Protocol):
    name: str

    def run(self, directory: str, mark_file: str, out_dir: str, state: RunState) -> dict[str, Any]:
        """Run the workload in DIRECTORY; return facts for the report."""


@dataclass
class ExternalProgram:
    path: str

    def __post_init__(self) -> None:
        if not os.path.isfile(self.path):
            raise UsageError(f"workload {self.path}: no such file")
        ext = os.path.splitext(self.path)[1]
        if ext not in INTERPRETERS and not os.access(self.path, os.X_OK):
            raise UsageError(f"workload {self.path}: not executable and not a .sh/.py/.json file")
        self.name = os.path.splitext(os.path.basename(self.path))[0]

    def command(self) -> list[str]:
        ext = os.path.splitext(self.path)[1]
        return INTERPRETERS.get(ext, []) + [os.path.abspath(self.path)]

    def run(self, directory: str, mark_file: str, out_dir: str, state: RunState) -> dict[str, Any]:
        env = dict(os.environ, POWERCUT_MARK_FILE=mark_file, POWERCUT_DIR=directory)
        log = os.path.join(out_dir, "workload.out")
        with open(log, "w") as out:
            code = run_child(self.command(), state, "workload", cwd=directory, env=env, stdout=out)
        return {"type": "program", "command": self.command(), "exit_code": code,
                "output": os.path.basename(log)}


def run_child(cmd: list[str], state: RunState, what: str, **popen: Any) -> int:
    """Run CMD in its own process group, recorded so a killed run's cleanup stops it."""
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True, **popen)
    res = record_process(state, p.pid, what, group=True)
    try:
        return p.wait()
    finally:
        state.release(res)
