"""Device tuning: the sysfs attributes a workload asks of the recorded device.

A workload's `device.queue` attributes go to /sys/block/DEV/queue/ (e.g.
nr_requests, the queue depth of seed experiment 2), its `device.bdi`
attributes to /sys/class/bdi/MAJ:MIN/ (the device's writeback limits, e.g.
strict_limit + max_bytes to make dirty-page throttling happen on a small
device). They are written in the order given, right after the run creates
the device and before mkfs, and only ever to that device. Loop devices and
their sysfs attributes outlive a run (the next run may get the same loopN),
so `tuned` puts the previous values back before the device is detached.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from foundation.errors import UsageError
from workloads.format import Device


def sysfs_dirs(block_device: str) -> dict[str, str]:
    """The queue and bdi sysfs directories of BLOCK_DEVICE."""
    rdev = os.stat(block_device).st_rdev
    return {
        "queue": f"/sys/block/{os.path.basename(block_device)}/queue",
        "bdi": f"/sys/class/bdi/{os.major(rdev)}:{os.minor(rdev)}",
    }


@contextmanager
def tuned(block_device: str, device: Device) -> Iterator[dict[str, str]]:
    """Apply DEVICE's attributes for the duration of the block, then restore them."""
    dirs = sysfs_dirs(block_device)
    previous = {}
    for group, attrs in (("queue", device.queue), ("bdi", device.bdi)):
        for name in attrs:
            path = os.path.join(dirs[group], name)
            if os.path.isfile(path):
                with open(path) as f:
                    previous[path] = f.read().strip()
    try:
        yield apply_tuning(block_device, device)
    finally:
        for path, value in reversed(list(previous.items())):
            try:
                with open(path, "w") as f:
                    f.write(value)
            except OSError:
                pass  # e.g. a value only valid with another attribute: the attach-time reset covers bdi


def apply_tuning(block_device: str, device: Device) -> dict[str, str]:
    """Write DEVICE's attributes; return each one's value as read back ("queue/nr_requests": "4"),
    which is what is in force (the kernel may round or clamp what was written)."""
    if not device.queue and not device.bdi:
        return {}
    dirs = sysfs_dirs(block_device)
    applied = {}
    for group, attrs in (("queue", device.queue), ("bdi", device.bdi)):
        for name, value in attrs.items():
            path = os.path.join(dirs[group], name)
            if not os.path.isfile(path):
                raise UsageError(f"device.{group}.{name}: {block_device} has no such attribute ({path})")
            try:
                with open(path, "w") as f:
                    f.write(str(value))
                with open(path) as f:
                    applied[f"{group}/{name}"] = f.read().strip()
            except OSError as e:
                raise UsageError(f"device.{group}.{name}: {path} refused {value!r}: {e.strerror}") from e
    return applied
