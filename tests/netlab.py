"""A network lab for joined-campaign tests: a redis-server and N "machines", each in
a network namespace of its own, linked by veth pairs.

Cleanup must hold when the test process dies without running its `finally` (a
SIGKILL, a timeout that exits the interpreter) and when two labs overlap (two test
sessions at once). So:
- every namespace is named after the pid of the process that made it
  (`pcjPID-r`, `pcjPID-0`, ...): the next lab deletes those whose process is gone,
  with whatever still runs in them (the dead lab's redis-server);
- `ip netns add` bind-mounts /run/netns onto itself the first time; a lab that
  caused that leaves a mark, and whichever lab leaves /run/netns empty (or sweeps
  it empty) takes the mount and the mark away. A mount that was there before
  (someone else's) has no mark and is never touched.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common import wait_until_redis_is_ready

PORT = 6379
NETNS_DIR = "/run/netns"
PREFIX = "pcj"
# Present while the /run/netns mount is one a lab made (see the module's docstring).
MOUNT_MARK = Path("/run/powercut-test-netns-mount")


@dataclass
class Lab:
    """Network namespaces: NAME-r runs redis-server; machine j is NAME-j, linked to it by veth j."""
    name: str
    machines: int

    def ns(self, j: int | str) -> str:
        return f"{self.name}-{j}"

    def redis_addr(self, j: int) -> str:
        return f"10.250.{j}.1"

    def url(self, j: int) -> str:
        return f"redis://{self.redis_addr(j)}:{PORT}/0"

    def enter(self, j: int | str) -> list[str]:
        """A command prefix that runs in namespace j's network, and nothing else of it (mounts stay shared)."""
        return ["nsenter", "-F", f"--net={NETNS_DIR}/{self.ns(j)}"]

    def link(self, j: int, up: bool) -> None:
        ip(self.enter(j), "link", "set", f"{self.name}m{j}", "up" if up else "down")


def mounted(path: str) -> bool:
    return any(line.split()[4] == path for line in Path("/proc/self/mountinfo").read_text().splitlines())


def ip(prefix: list[str], *args: str) -> None:
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, timeout=30)


def lab_namespaces() -> list[tuple[str, int]]:
    """(namespace, pid of the process that made it) of every lab namespace there is."""
    names = os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []
    found = [(ns, re.fullmatch(rf"{PREFIX}(\d+)-(?:r|\d+)", ns)) for ns in names]
    return [(ns, int(m[1])) for ns, m in found if m]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _ns_pids(ns: str) -> list[int]:
    return [int(p) for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()]


def _delete_namespace(ns: str, grace_s: float = 60) -> None:
    """Stop what runs in NS, then delete it (deleting it deletes the veth ends in it).
    SIGTERM first: a powercut process still in there (a killed machine's worker) tears its
    devices down on it; SIGKILL would leave its mounts and a dead FUSE mount behind."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _ns_pids(ns):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 10)
        while _ns_pids(ns) and time.monotonic() < deadline:
            time.sleep(0.2)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def release_netns_mount() -> None:
    """Undo the /run/netns mount a lab made, once no namespace is left under it."""
    if not MOUNT_MARK.exists():
        return
    if mounted(NETNS_DIR) and os.listdir(NETNS_DIR):
        return  # another lab (or someone) still has namespaces there
    if mounted(NETNS_DIR):
        subprocess.run(["umount", NETNS_DIR], capture_output=True)
    MOUNT_MARK.unlink(missing_ok=True)


def sweep_dead_labs() -> list[str]:
    """Delete the namespaces of labs whose process is gone; returns their names."""
    dead = [ns for ns, pid in lab_namespaces() if not _alive(pid)]
    for ns in dead:
        _delete_namespace(ns)
    release_netns_mount()
    return dead


@contextmanager
def lab(tmp: Path, machines: int) -> Iterator[Lab]:
    sweep_dead_labs()
    n = Lab(f"{PREFIX}{os.getpid()}", machines)
    made: list[str] = []
    redis_proc = None
    netns_was_mounted = mounted(NETNS_DIR)
    try:
        for j in ["r", *range(machines)]:
            ip([], "netns", "add", n.ns(j))
            made.append(n.ns(j))
            if not netns_was_mounted and mounted(NETNS_DIR):
                MOUNT_MARK.touch()
                netns_was_mounted = True
            ip(n.enter(j), "link", "set", "lo", "up")
        for j in range(machines):
            # both ends are created in the redis namespace; one moves to the machine's
            r_end, m_end = f"{n.name}r{j}", f"{n.name}m{j}"
            ip(n.enter("r"), "link", "add", r_end, "type", "veth", "peer", "name", m_end)
            ip(n.enter("r"), "link", "set", m_end, "netns", n.ns(j))
            ip(n.enter("r"), "addr", "add", f"{n.redis_addr(j)}/24", "dev", r_end)
            ip(n.enter("r"), "link", "set", r_end, "up")
            ip(n.enter(j), "addr", "add", f"10.250.{j}.2/24", "dev", m_end)
            ip(n.enter(j), "link", "set", m_end, "up")
        redis_proc = subprocess.Popen(
            [*n.enter("r"), "redis-server", "--port", str(PORT), "--bind", *(n.redis_addr(j) for j in range(machines)),
             "--save", "", "--appendonly", "no", "--dir", str(tmp), "--protected-mode", "no"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        wait_until_redis_is_ready(redis_proc)
        assert subprocess.run([*n.enter(0), "redis-cli", "-h", n.redis_addr(0), "-p", str(PORT), "ping"],
                              capture_output=True, text=True).stdout.strip() == "PONG"  # reached from a machine
        yield n
    finally:
        if redis_proc is not None:
            redis_proc.kill()
            redis_proc.wait()
        for ns in reversed(made):
            _delete_namespace(ns)
        release_netns_mount()
