"""Who holds a block device: the evidence when a mount finds it busy.

A mount that fails with EBUSY ("Can't open blockdev") says nothing about
the file system on the device: something else has it claimed. This module
looks at everything the kernel shows about that: mounts of the device,
stacked holders (/sys/block/DEV/holders), processes with the device open,
and whether the loop device is still bound to the file we expect.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Holders:
    device: str
    mounts: list[str] = field(default_factory=list)        # mount points of the device
    stacked: list[str] = field(default_factory=list)       # /sys/block/DEV/holders (dm, md, ...)
    processes: list[str] = field(default_factory=list)     # "pid comm" with an fd on the device
    backing: str | None = None                             # the loop device's backing file now

    def describe(self) -> str:
        parts = [f"mounted on {', '.join(self.mounts)}" if self.mounts else "not mounted",
                 f"stacked holders {', '.join(self.stacked)}" if self.stacked else "no stacked holders",
                 f"open by {', '.join(self.processes)}" if self.processes else "open by no other process"]
        if self.backing is not None:
            parts.append(f"backed by {self.backing}")
        return f"{self.device}: " + "; ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {"device": self.device, "mounts": self.mounts, "stacked": self.stacked,
                "processes": self.processes, "backing": self.backing}


def _rdev(path: str) -> int | None:
    try:
        return os.stat(path).st_rdev
    except OSError:
        return None


def holders(device: str) -> Holders:
    """Everything visible that holds DEVICE (a /dev path); never raises for a vanished process."""
    h = Holders(device)
    rdev = _rdev(device)
    name = os.path.basename(device)
    try:
        h.stacked = sorted(os.listdir(f"/sys/block/{name}/holders"))
    except OSError:
        pass
    try:
        with open(f"/sys/block/{name}/loop/backing_file") as f:
            h.backing = f.read().strip()
    except OSError:
        pass
    if rdev is None:
        return h
    dev_str = f"{os.major(rdev)}:{os.minor(rdev)}"
    try:
        with open("/proc/self/mountinfo") as f:
            h.mounts = [line.split()[4] for line in f if line.split()[2] == dev_str]
    except OSError:
        pass
    me = os.getpid()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target == device or (target.startswith("/dev/") and _rdev(target) == rdev):
                h.processes.append(f"{pid} {_comm(pid)}{' (this process)' if int(pid) == me else ''} fd {fd}")
    return h


def _comm(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"
