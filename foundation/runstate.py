"""The state directory: every system resource a run creates, written down first.

Each run gets STATE_ROOT/<run-id>/ with `run.json` (who owns it) and
`resources.jsonl`, an append-only journal: a resource is recorded *before* it
is created, and a `released` line is appended once it is torn down. Teardown
(normal exit, exception, signal) and `powercut cleanup` (after a kill -9)
both walk the same journal in reverse, so nothing is ever found by name
pattern and nothing powercut did not create is ever touched.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from foundation import jsonl, ownership, sysres
from foundation.errors import EnvError

STATE_ROOT = os.environ.get("POWERCUT_STATE_DIR", "/run/powercut")
# Scratch images and logs live on tmpfs when there is one: crash checking is
# I/O bound on these files and they are thrown away.
SCRATCH_ROOT = os.environ.get(
    "POWERCUT_SCRATCH", "/dev/shm/powercut" if os.path.isdir("/dev/shm") else "/var/tmp/powercut"
)
# A Unix socket's path has at most 107 bytes (AF_UNIX): sockets (a live guest's control
# channel) live under this short root, whatever the state and scratch roots are.
SOCKET_ROOT = "/run/powercut-sockets"


@dataclass
class Resource:
    rid: int
    kind: str  # mount | loop | fuse | dm | process | dir
    info: dict[str, Any]


def _proc_start_time(pid: int) -> int | None:
    """Start time of PID in clock ticks, to tell a live process from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _ensure_roots(*paths: str) -> None:
    try:
        for path in paths:
            os.makedirs(path, exist_ok=True)
            if not ownership.is_owned(path):
                ownership.tag(path, "root")
    except PermissionError as e:
        raise EnvError(f"cannot create {e.filename}: powercut needs root (loop devices, mounts)") from e


class RunState:
    """One run's entry in the state directory, and the teardown of what it made."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.run_id = os.path.basename(path)
        self._journal = os.path.join(path, "resources.jsonl")
        self._next = 0

    # -- creation --------------------------------------------------------
    @classmethod
    def create(cls, purpose: str) -> "RunState":
        _ensure_roots(STATE_ROOT, SCRATCH_ROOT)
        run_id = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        path = os.path.join(STATE_ROOT, run_id)
        os.makedirs(path)
        with open(os.path.join(path, "run.json"), "w") as f:
            json.dump({"pid": os.getpid(), "start_time": _proc_start_time(os.getpid()),
                       "purpose": purpose, "created": time.time()}, f)
        # Tagged only once run.json names its owner: `powercut cleanup` (another process)
        # considers tagged directories only, and would take one without an owner for dead.
        ownership.tag(path, "run")
        state = cls(path)
        state.scratch = state.make_dir(os.path.join(SCRATCH_ROOT, run_id))
        return state

    scratch: str = ""

    def subdir(self, name: str) -> str:
        """A directory inside the run's state dir (mount points live here)."""
        p = os.path.join(self.path, name)
        os.makedirs(p, exist_ok=True)
        return p

    def record(self, kind: str, **info: Any) -> Resource:
        """Write down a resource before creating it."""
        res = Resource(self._next, kind, info)
        self._next += 1
        self._append({"rid": res.rid, "kind": kind, **info})
        return res

    def released(self, res: Resource) -> None:
        self._append({"released": res.rid})

    def _append(self, obj: dict[str, Any]) -> None:
        jsonl.append(self._journal, obj)

    def make_dir(self, path: str) -> str:
        """Create a scratch directory, recorded for removal."""
        self.record("dir", path=path)
        os.makedirs(path)
        ownership.tag(path, "scratch")
        return path

    def socket_dir(self) -> str:
        """A new short directory for this run's Unix sockets, recorded for removal."""
        _ensure_roots(SOCKET_ROOT)
        return self.make_dir(os.path.join(SOCKET_ROOT, self.run_id))

    # -- teardown --------------------------------------------------------
    def live_resources(self) -> list[Resource]:
        if not os.path.exists(self._journal):
            return []
        made: dict[int, Resource] = {}
        for obj in jsonl.read(self._journal):
            if "released" in obj:
                made.pop(obj["released"], None)
            else:
                rid = obj.pop("rid")
                kind = obj.pop("kind")
                made[rid] = Resource(rid, kind, obj)
                self._next = max(self._next, rid + 1)
        return sorted(made.values(), key=lambda r: r.rid)

    def release(self, res: Resource) -> None:
        """Tear one resource down, if it is still the one we made."""
        RELEASERS[res.kind](res.info)
        self.released(res)

    def teardown(self, log: Callable[[str], None] | None = None) -> list[str]:
        """Release everything still live, newest first; returns what failed.
        Ctrl-C and SIGTERM wait until it is done (see signals_deferred)."""
        failed = []
        with signals_deferred():
            for res in reversed(self.live_resources()):
                try:
                    self.release(res)
                except Exception as e:  # keep going: release as much as we can
                    msg = f"{res.kind} {res.info}: {e}"
                    failed.append(msg)
                    if log:
                        log(f"cleanup: could not release {msg}")
            if not failed:
                shutil.rmtree(self.path, ignore_errors=True)
        return failed

    def teardown_or_warn(self) -> None:
        """teardown(), telling the user on stderr what is left for `powercut cleanup`."""
        failed = self.teardown(log=lambda m: print(m, file=sys.stderr))
        if failed:
            print(f"powercut: {len(failed)} resource(s) left behind: run `powercut cleanup`", file=sys.stderr)

    def owner_alive(self) -> bool:
        meta = self._meta()
        return meta is not None and _proc_start_time(meta["pid"]) == meta.get("start_time") is not None

    def owner_pid(self) -> int | None:
        meta = self._meta()
        return None if meta is None else int(meta["pid"])

    def _meta(self) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self.path, "run.json")) as f:
                return dict(json.load(f))
        except (OSError, json.JSONDecodeError):
            return None


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back until the block ends, then delivered again.

    A teardown cut short by the signal it is running for leaves a resource
    behind (a campaign stops its workers with SIGTERM while they may already
    be tearing down). Only the main thread can set handlers; elsewhere the
    block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum))
           for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(pending):
            os.kill(os.getpid(), sig)


def all_runs() -> list[RunState]:
    if not os.path.isdir(STATE_ROOT) or not ownership.is_owned(STATE_ROOT):
        return []
    runs = []
    for name in sorted(os.listdir(STATE_ROOT)):
        p = os.path.join(STATE_ROOT, name)
        # Runs only: another state root nested here (a test's machine) is not a run without an
        # owner, and its teardown would delete the journals its own runs need.
        if os.path.isdir(p) and ownership.tag_of(p) == "run":
            runs.append(RunState(p))
    return runs


# -- releasers: each checks the resource is still the one recorded -------
def _release_mount(info: dict[str, Any]) -> None:
    sysres.umount(info["path"])


def _release_loop(info: dict[str, Any]) -> None:
    sysres.loop_detach_backed_by(info["backing"])


def _release_fuse(info: dict[str, Any]) -> None:
    sysres.fuse_unmount(info["path"])


def _release_dm(info: dict[str, Any]) -> None:
    sysres.dm_remove(info["name"], info["uuid"])


def _release_process(info: dict[str, Any]) -> None:
    pid = info["pid"]
    if _proc_start_time(pid) != info.get("start_time"):
        return  # gone, or the pid now belongs to someone else
    # A workload runs in its own process group: stop all of it, not just the leader.
    kill = os.killpg if info.get("group") else os.kill
    kill(pid, signal.SIGTERM)
    if not sysres.wait_pid_gone(pid, timeout=10):
        kill(pid, signal.SIGKILL)
        sysres.wait_pid_gone(pid, timeout=10)


def _release_dir(info: dict[str, Any]) -> None:
    path = info["path"]
    if os.path.isdir(path) and ownership.is_owned(path):
        shutil.rmtree(path)


def _release_trace_instance(info: dict[str, Any]) -> None:
    # A tracefs instance goes with rmdir (its files cannot be removed one by one).
    try:
        os.rmdir(info["path"])
    except FileNotFoundError:
        pass


RELEASERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "mount": _release_mount,
    "loop": _release_loop,
    "fuse": _release_fuse,
    "dm": _release_dm,
    "process": _release_process,
    "dir": _release_dir,
    "trace-instance": _release_trace_instance,
}


def record_process(state: RunState, pid: int, what: str, *, group: bool = False) -> Resource:
    """Record an already started child (its pid exists only after the fork)."""
    return state.record("process", pid=pid, start_time=_proc_start_time(pid), what=what, group=group)


def attach_recorded_loop(state: RunState, backing: str, **attach: Any) -> tuple[str, Resource]:
    """Record and attach a loop device on BACKING, with no signal in between: a SIGTERM
    while losetup runs could leave a device attached after the teardown looked for it
    (and then the FUSE mount under BACKING cannot go either)."""
    with signals_deferred():
        res = state.record("loop", backing=backing)
        return sysres.loop_attach(backing, **attach), res


def spawn_recorded(state: RunState, cmd: list[str], what: str, *, group: bool = False,
                   **popen: Any) -> tuple["subprocess.Popen[bytes]", Resource]:
    """Start CMD and record it, with no signal in between.

    A SIGTERM or Ctrl-C raised inside Popen (after the fork) or before the
    record is written would leave a child nobody stops: a pc-recorder holding
    its FUSE mount, and the caller's stdout pipe, for ever."""
    with signals_deferred():
        proc = subprocess.Popen(cmd, **popen)
        return proc, record_process(state, proc.pid, what, group=group)
