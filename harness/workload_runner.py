"""Ways to run a workload on the mounted file system under test.

`ExecutorWorkload` runs a JSON workload (format powercut-workload/1) with the
C executor, which times every op and marks the log after each one.
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

from harness import paths
from harness.errors import EnvError, UsageError
from harness.runstate import RunState, record_process
from workloads.format import load_workload
from workloads.plan import build_plan, render_plan

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


class ExecutorWorkload:
    """A powercut-workload/1 JSON file, run by build/pc-exec."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.workload = load_workload(path)
        self.plan = build_plan(self.workload)
        self.name = self.workload.name

    def run(self, directory: str, mark_file: str, out_dir: str, state: RunState) -> dict[str, Any]:
        exe = paths.c_program("pc-exec")
        plan_path = os.path.join(out_dir, "plan.txt")
        records = os.path.join(out_dir, "records.bin")
        with open(plan_path, "w") as f:
            f.write(render_plan(self.plan))
        err_path = os.path.join(out_dir, "executor.err")
        with open(err_path, "w") as err:
            code = run_child([exe, "--plan", plan_path, "--dir", directory, "--out", records,
                              "--mark-file", mark_file], state, "pc-exec", stdout=err)
        if code != 0:
            lines = [ln for ln in open(err_path).read().splitlines() if "warning" not in ln]
            raise EnvError(f"pc-exec failed (exit {code}): {lines[0] if lines else 'no message'}")
        return {"type": "json", "file": os.path.abspath(self.path), "records": os.path.basename(records),
                "plan": os.path.basename(plan_path)}


def load_runner(path: str) -> WorkloadRunner:
    """A JSON workload file runs in the executor; anything else as a program."""
    if path.endswith(".json"):
        return ExecutorWorkload(path)
    return ExternalProgram(path)
