"""What tests share, in one place (the xfstests `common/` idea): paths, the
`require_*` markers a test states up front, and the domain verbs that many
tests spell the same way.

A test file says what it needs at the top, e.g.
    pytestmark = [pytest.mark.e2e, require_root_stack]
and a missing part skips it with one reason, written here once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from workloads.plan import Plan, render_plan
from workloads.results import Results, read_records

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
POWERCUT = [sys.executable, "-m", "cli.main"]
WORKLOADS = ROOT / "tests" / "workloads"
EXEC = BUILD / "pc-exec"
RECORDER = BUILD / "pc-recorder"
# The kernel the vm tests boot (`make bench` and the README use the same package).
KERNEL_612 = "debian:linux-image-6.12-amd64"
# Every package a campaign's workloads can come from: the layers below bench (tests/test_layers.py).
# The benchmarks' data (fstests' sequences, known bugs' workloads) must stay out of their reach.
GENERATOR_PACKAGES = ("foundation", "workloads", "replay", "checkers", "harness", "fuzz")


def is_root() -> bool:
    return os.geteuid() == 0


# --- require_*: one reason per missing part -------------------------------------------------
ROOT_REASON = "needs root (loop devices, mounts, /dev/kmsg, apt-get)"
ROOT_STACK_REASON = "needs root, /dev/fuse and build/pc-recorder (run `make test`)"
require_root = pytest.mark.skipif(not is_root(), reason=ROOT_REASON)
require_exec = pytest.mark.skipif(not EXEC.exists(), reason="build/pc-exec not built (make test)")
require_root_stack = pytest.mark.skipif(
    not is_root() or not Path("/dev/fuse").exists() or not RECORDER.exists(),
    reason=ROOT_STACK_REASON)
require_afl = pytest.mark.skipif(shutil.which("afl-fuzz") is None,
                                 reason="afl++ not installed (`make test` and `make afl` install it)")
require_qemu = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                  reason="qemu not installed (`make test` installs it; `--backend vm` on first use)")

# A test that boots a QEMU guest: slow under TCG, needs root for the kernel cache and apt-get.
vm = [pytest.mark.e2e, pytest.mark.vm, require_root]


# --- domain verbs ---------------------------------------------------------------------------
def run_exec(plan: Path, directory: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """pc-exec runs PLAN on DIRECTORY (a plain directory: no recording)."""
    return subprocess.run([str(EXEC), "--plan", str(plan), "--dir", str(directory), *args],
                          capture_output=True, check=check)


def exec_plan(plan: Plan, work: Path) -> tuple[Results, list[tuple[int, str]]]:
    """pc-exec runs PLAN on WORK/fs (made here; no recording): its records and its marks, (index, text)."""
    (work / "fs").mkdir(parents=True)
    (work / "plan").write_text(render_plan(plan))
    run_exec(work / "plan", work / "fs", "--out", str(work / "records"), "--mark-file", str(work / "marks"))
    return read_records(work / "records", plan), list(enumerate((work / "marks").read_text().splitlines()))


def report(out: Path) -> dict:
    """OUT/report.json of a run or a campaign."""
    return json.loads((out / "report.json").read_text())


def journal(campaign: Path, worker: str = "*") -> list[dict]:
    """Every workload a campaign journaled (all workers, or WORKER's), in file order."""
    return [json.loads(line) for j in sorted((campaign / "journal").glob(f"{worker}.jsonl"))
            for line in j.read_text().splitlines() if line.strip()]


def wait_until_redis_is_ready(proc: subprocess.Popen[str]) -> None:
    """Block until redis-server PROC logs that it accepts connections (its stdout, a pipe), then
    drain the rest of its log in the background so it never blocks on a full pipe. No deadline:
    its exit ends the wait (EOF), however loaded the machine is."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if "Ready to accept connections" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return
    raise AssertionError(f"redis-server exited ({proc.wait()}) before accepting connections")


@contextmanager
def redis_server(directory: Path, *args: str) -> Iterator[str]:
    """A real redis-server on loopback, on a free port, with ARGS; yields its redis:// URL."""
    import redis  # the tests that start one skip without redis-server; the package is always pinned
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", *args, "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(directory)], stdout=subprocess.PIPE, text=True)
    try:
        wait_until_redis_is_ready(proc)
        assert redis.Redis(port=port).ping()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()


def running(pid: int | str) -> bool:
    """PID exists and is not a zombie (a killed process is gone once its parent, or init, reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def newest(series: str, n: int) -> list[str]:
    """The N newest packages of a Debian kernel series apt knows, oldest first: series "6.1"
    (linux-image-6.1.0-K-amd64) or "6.12" (linux-image-6.12.K+deb12-amd64)."""
    pattern = {"6.1": r"^linux-image-6\.1\.0-[0-9]+-amd64$", "6.12": r"^linux-image-6\.12\.[0-9]+\+deb12-amd64$"}[series]
    p = subprocess.run(["apt-cache", "search", "--names-only", pattern], capture_output=True, text=True, check=True)
    names = sorted((line.split()[0] for line in p.stdout.splitlines()),
                   key=lambda name: int(re.findall(r"\d+", name)[3 if series == "6.1" else 2]))
    if len(names) < n:
        pytest.skip(f"apt knows fewer than {n} packages of the {series} series (apt-get update)")
    return names[-n:]
