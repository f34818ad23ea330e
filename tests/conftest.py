"""Shared fixtures: an isolated powercut state/scratch dir per test, and leak checks.

Each end-to-end test gets its own POWERCUT_STATE_DIR and POWERCUT_SCRATCH, so
it can check that *its* loop devices, mounts and daemons are gone afterwards
without being confused by other tests running at the same time.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# A shell without job control starts a background command (`make test &`) with SIGINT ignored, and
# every child inherits that: the tests that press Ctrl-C on powercut would wait on runs that never
# hear it. A handler (unlike SIG_IGN) is reset to the default at exec, so children hear SIGINT again.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

if TYPE_CHECKING:
    from replay.logformat import LogReader

# Paths and require_* markers live in common.py; the old names stay importable from here.
from common import BUILD, POWERCUT, ROOT, ROOT_REASON, ROOT_STACK_REASON, WORKLOADS, require_root_stack  # noqa: F401

import killed_sessions  # noqa: E402

needs_root_stack = require_root_stack
CALIBRATION_FSYNCS = "100"


@dataclass
class PcEnv:
    state: Path
    scratch: Path
    tmp: Path

    def env(self, **extra: str) -> dict[str, str]:
        # CALIBRATION_FSYNCS: `powercut run` of a JSON workload first times the recorder's fsyncs
        # (1000 a device, about a second); the tests check those figures, not their precision.
        return {"POWERCUT_CALIBRATION_FSYNCS": CALIBRATION_FSYNCS, **os.environ,
                "POWERCUT_STATE_DIR": str(self.state), "POWERCUT_SCRATCH": str(self.scratch),
                "PYTHONPATH": str(ROOT), **extra}

    def run(self, *args: str, check_rc: int | None = None, env: dict[str, str] | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([*POWERCUT, *args], capture_output=True, text=True, cwd=self.tmp,
                           env=env or self.env(), timeout=timeout)
        if check_rc is not None:
            assert p.returncode == check_rc, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        return p

    def leftovers(self) -> list[str]:
        """Loop devices, mounts and processes that belong to this test's runs."""
        left = []
        for name in os.listdir("/sys/block"):
            try:
                backing = Path(f"/sys/block/{name}/loop/backing_file").read_text().strip()
            except OSError:
                continue
            if backing.startswith((str(self.scratch), str(self.state))):
                left.append(f"loop /dev/{name} -> {backing}")
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mp = line.split()[4]
            if mp.startswith((str(self.state), str(self.scratch))):
                left.append(f"mount {mp}")
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                cwd = ""
            if any(str(d) in cmd or cwd.startswith(str(d)) for d in (self.scratch, self.state)):
                left.append(f"process {pid}: {cmd}")
        return left


@pytest.fixture
def pc(tmp_path: Path) -> PcEnv:
    env = PcEnv(tmp_path / "state", tmp_path / "scratch", tmp_path)
    yield env
    left = env.leftovers()
    if left:  # tear down by hand so one failure doesn't poison later tests
        # (every state root the test made: a joined test's machines each have their own)
        killed_sessions.sweep(tmp_path)
    assert not left, "left behind: " + "; ".join(left)
    shutil.rmtree(tmp_path, ignore_errors=True)


def assert_log_replays_to(reader: LogReader, device_bytes: int, final: Path, scratch: Path) -> None:
    """The whole log replayed onto a zeroed disk of DEVICE_BYTES is FINAL, byte for byte."""
    from replay.replayer import log_differs_from
    assert final.stat().st_size == device_bytes
    at = log_differs_from(reader, str(final), str(scratch / "replayed.img"))
    assert at is None, f"replayed image differs in the 64 KiB at byte {at}"


# tryfirst: before pytest deselects by marker (-m quick) and before pytest-xdist reads xdist_group.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that is neither e2e, vm nor slow is `quick` (the inner loop: `make test-quick`).
    A test that requires root (real devices, mounts) or runs powercut itself (the `pc` fixture)
    counts as e2e. Then the order and grouping `make test`'s workers (pytest-xdist) run them in."""
    for item in items:
        if "pc" in getattr(item, "fixturenames", ()) or any(
                m.kwargs.get("reason") in (ROOT_REASON, ROOT_STACK_REASON) for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.e2e)
        if not any(item.get_closest_marker(m) for m in ("e2e", "vm", "slow")):
            item.add_marker(pytest.mark.quick)
        group = _worker_group(item)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
    items[:] = _longest_first(items)
    if _xdist_worker() and config.getvalue("loadgroup"):
        _name_groups(items)


def _name_groups(items: list[pytest.Item]) -> None:
    """`--dist loadgroup` keeps the tests whose node id ends in @GROUP on one worker. pytest-xdist
    3.6-3.8 append it to `item._nodeid`, which pytest 9.2 no longer reads (the id is `item._id`):
    without this the groups were silently spread over the workers (two dm guests for one fixture)."""
    from _pytest.nodeid import NodeId
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark and hasattr(item, "_id") and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{mark.args[0] if mark.args else mark.kwargs.get('name', 'default')}")


def _worker_group(item: pytest.Item) -> str | None:
    """Tests that share a module-scoped fixture (a booted guest, a built tree) run on one worker,
    so it is set up once; `--dist loadgroup` keeps an xdist_group on one worker."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(d[-1].scope in ("module", "package") for d in defs.values() if d):
        return item.module.__name__
    return None


def _longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """Modules with guest tests first, then slow ones, then e2e, quick ones last (each module's
    tests stay together, in their order): a worker that starts a two-minute guest test last
    would keep the whole run waiting on it. pytest-xdist hands tests out in this order."""
    def rank(item: pytest.Item) -> int:
        return next((i for i, m in enumerate(("vm", "slow", "e2e")) if item.get_closest_marker(m)), 3)
    module_rank: dict[str, int] = {}
    for item in items:
        key = item.nodeid.split("::")[0]
        module_rank[key] = min(module_rank.get(key, 3), rank(item))
    return sorted(items, key=lambda item: module_rank[item.nodeid.split("::")[0]])


def _xdist_worker() -> bool:
    """This process is one of pytest-xdist's workers (the controller runs the session hooks once)."""
    return "PYTEST_XDIST_WORKER" in os.environ


# --- the suite never writes into the source tree -------------------------------------------
# Snapshot of what git would show (new or changed files) plus the ignored output folders a
# command writes by default (out/, campaigns/), before and after the session: anything new
# there came from a test (a command run with cwd=ROOT and no --out, a build into the tree).
def _tree_state() -> set[str]:
    p = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all"],
                       capture_output=True, text=True)
    state = set(p.stdout.splitlines()) if p.returncode == 0 else set()
    for d in ("out", "campaigns"):
        if (ROOT / d).is_dir():
            state |= {f"{d}/{name}" for name in os.listdir(ROOT / d)}
    return state


def pytest_sessionstart(session: pytest.Session) -> None:
    # With pytest-xdist the controller alone checks the tree and sweeps, before any worker starts:
    # a worker's snapshot would count a sibling's files, and its sweep root is its own basetemp.
    if _xdist_worker():
        return
    session.config.stash[_TREE] = _tree_state()
    if os.geteuid() == 0:
        swept = killed_sessions.sweep(_pytest_tmp_root(session.config))
        if swept:
            print(f"\nreleased what killed test sessions left: {'; '.join(swept)}", file=sys.stderr)


def _pytest_tmp_root(config: pytest.Config) -> Path:
    """Where pytest keeps its numbered session directories (or the --basetemp given)."""
    if config.option.basetemp:
        return Path(config.option.basetemp)
    return Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_TREE, None)
    if before is None or os.environ.get("POWERCUT_TESTS_TREE_CHECK") == "0":
        return
    new = sorted(_tree_state() - before)
    if new:
        print(f"\ntests wrote into the source tree {ROOT}: {', '.join(new[:10])}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_TREE = pytest.StashKey[set[str]]()
