"""A test session killed mid-run leaves a recorder stack whose daemon is dead; the next
session's start releases it (tests/killed_sessions.py), before pytest deletes its journals."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest

import killed_sessions
from foundation import sysres
from conftest import WORKLOADS, PcEnv, needs_root_stack
from test_run_e2e import start_blocked_run

pytestmark = needs_root_stack


def dead_fuse_mounts(under: Path) -> list[str]:
    dead = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4]
        if mp.startswith(str(under)):
            try:
                os.stat(mp)
            except OSError as e:
                if e.errno == errno.ENOTCONN:
                    dead.append(mp)
    return dead


def other_session(pc: PcEnv, test: str) -> tuple[Path, PcEnv]:
    """Another session's test in the layout of pytest's tree: <root>/pytest-N/<test>/{state,scratch}."""
    sessions = pc.tmp / "sessions"
    test_dir = sessions / "pytest-9" / test
    return sessions, PcEnv(test_dir / "state", test_dir / "scratch", pc.tmp)


# serial: while its dead FUSE mount exists, every mkfs.btrfs on the machine fails (what it shows).
@pytest.mark.serial
def test_a_killed_sessions_dead_recorder_stack_is_released_by_the_next_session(pc: PcEnv) -> None:
    sessions, killed = other_session(pc, "test_x0")
    proc, _hold = start_blocked_run(killed)
    try:
        recorders = [int(x.split()[1].rstrip(":")) for x in killed.leftovers()
                     if x.startswith("process ") and "pc-recorder" in x]
        assert recorders, killed.leftovers()
        # The session dies whole: powercut and its FUSE daemon, no teardown.
        proc.kill()
        proc.wait()
        for pid in recorders:
            os.kill(pid, signal.SIGKILL)
            assert sysres.wait_pid_gone(pid, timeout=60)
        assert dead_fuse_mounts(killed.state), "the FUSE mount should be dead now (ENOTCONN)"
        assert killed_sessions.state_roots(sessions) == [killed.state]  # not the scratch root
        # What that costs everyone else on the machine (how CI once failed): mkfs.btrfs refuses;
        # powercut says so in one line, with the way out.
        p = pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "btrfs", "--out", str(pc.tmp / "out"))
        assert p.returncode == 2 and "`powercut cleanup`" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr

        released = killed_sessions.sweep(sessions)
        assert released and all("released" in r for r in released), released
        assert killed.leftovers() == []
    finally:
        if killed.leftovers():
            pc.run("cleanup", env=killed.env())


def test_a_live_sessions_run_is_not_swept(pc: PcEnv) -> None:
    sessions, live = other_session(pc, "test_y0")
    proc, hold = start_blocked_run(live)
    try:
        before = live.leftovers()
        assert killed_sessions.sweep(sessions) == []
        assert live.leftovers() == before
    finally:
        with open(hold, "w") as f:
            f.write("go\n")
        proc.communicate(timeout=300)
    assert proc.returncode == 0 and live.leftovers() == []


def test_state_roots_are_found_where_xdist_workers_keep_their_tests(tmp_path: Path) -> None:
    """`make test` runs on pytest-xdist: a test's directory is pytest-N/popen-gwK/<test>/, so a
    joined machine's state root sits five levels down (and the run directories are not entered)."""
    from foundation import ownership
    nested = tmp_path / "pytest-3" / "popen-gw1" / "test_x0" / "state" / "m2"
    (nested / "r1").mkdir(parents=True)
    ownership.tag(str(nested), "root")
    ownership.tag(str(nested / "r1"), "run")
    assert killed_sessions.state_roots(tmp_path) == [nested]
