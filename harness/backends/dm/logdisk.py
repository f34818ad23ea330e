"""The log device of a dm-log-writes recording: its size, and the finished log read off it.

Shared by the dm backend (a loop device or the user's log partition) and the
vm backend (the guest's log disk): the kernel writes the same format either way.
"""

from __future__ import annotations

import os

from foundation import ownership
from foundation.errors import EnvError
from replay.logformat import END_MARK, LogReader

COPY_CHUNK = 4 << 20


def log_disk_bytes(device_bytes: int) -> int:
    # Sparse, so generous is free; a full log disk makes dm-log-writes stop
    # logging, which finish_log reports.
    return max(1 << 30, 8 * device_bytes)


def log_end(path: str) -> int:
    """Offset just after the log's last entry, which must be the kernel's end mark."""
    with LogReader(path) as reader:
        last = None
        for last in reader.entries():
            pass
        if last is None or last.mark != END_MARK:
            raise EnvError(f"{path}: the log does not end with {END_MARK!r} "
                           "(dm-log-writes stopped early: log device full?)")
        return last.next_offset(reader.sectorsize)


def finish_log(path: str) -> None:
    """Check the kernel closed the log file PATH, then cut it after its last entry."""
    os.truncate(path, log_end(path))


def copy_log(device: str, path: str) -> None:
    """The finished log on block DEVICE, copied into the new file PATH (only its entries)."""
    end = log_end(device)
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    out = ownership.create_file(path)
    try:
        done = 0
        while done < end:
            chunk = os.pread(fd, min(COPY_CHUNK, end - done), done)
            if not chunk:
                raise EnvError(f"{device}: short read at {done} of a {end}-byte log")
            os.write(out, chunk)
            done += len(chunk)
    finally:
        os.close(fd)
        os.close(out)
