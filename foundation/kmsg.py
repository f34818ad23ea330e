"""The kernel log lines of one operation (a mount), read from /dev/kmsg.

A file system explains a refused mount in the kernel log ("JBD2: journal
recovery failed", "EXT4-fs (loop3): error loading journal"), not in the
mount call's error. KernelLog marks the end of the log before the call and
returns the records logged since, keeping those that name the device and
those that name no device at all (jbd2 prints some without one). A line
that names another device by its /dev path ("BTRFS: device fsid ... devid 1
transid 8 /dev/loop5 scanned by ...", printed when any process scans a
btrfs device) is about that device. On a machine where other mounts run at
the same time, an untagged line may still come from another device: the
evidence says so.
"""

from __future__ import annotations

import errno
import os
import re

KMSG = "/dev/kmsg"
MAX_LINES = 40
# "EXT4-fs (loop3): ...", "XFS (loop3): ...", "BTRFS error (device loop3): ...", "loop3: ..."
_DEVICE_TAG = re.compile(r"\((?:device )?([a-z]+[0-9]+(?:p[0-9]+)?)\)|^([a-z]+[0-9]+): ")
_DEVICE_PATH = re.compile(r"/dev/([a-z]+[0-9]+(?:p[0-9]+)?)\b")


class KernelLog:
    """with KernelLog(dev) as log: ...; log.lines() -> what the kernel said about DEV meanwhile."""

    def __init__(self, device: str) -> None:
        self.name = os.path.basename(device)
        self.fd = -1

    def __enter__(self) -> "KernelLog":
        try:
            self.fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError:
            self.close()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @property
    def available(self) -> bool:
        return self.fd >= 0

    def lines(self) -> list[str]:
        """Messages since __enter__ about this device or about no device (at most MAX_LINES)."""
        out: list[str] = []
        while self.fd >= 0:
            try:
                rec = os.read(self.fd, 8192)
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten while we read: go on with what follows
                    continue
                break  # EAGAIN: nothing more
            if not rec:
                break
            msg = rec.decode(errors="replace").split(";", 1)[-1].split("\n", 1)[0]
            if self._about_us(msg):
                out.append(msg)
        return out[-MAX_LINES:]

    def _about_us(self, msg: str) -> bool:
        m = _DEVICE_TAG.search(msg)
        if m is not None:
            return self.name in (m.group(1), m.group(2))
        named = _DEVICE_PATH.findall(msg)
        return not named or self.name in named
