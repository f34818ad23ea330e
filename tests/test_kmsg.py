"""KernelLog keeps the kernel's lines about one device: written into the real
/dev/kmsg (root may add records to it), read back through KernelLog."""

from __future__ import annotations

import os
import uuid


from foundation.kmsg import KMSG, KernelLog
from common import require_root


def _printk(text: str) -> None:
    fd = os.open(KMSG, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


@require_root
def test_lines_about_other_devices_are_left_out() -> None:
    tag = uuid.uuid4().hex[:8]  # only this test's lines count: other jobs log meanwhile
    ours = [f"EXT4-fs (loop901): {tag} error loading journal",
            f"BTRFS: device fsid {tag} devid 1 transid 8 /dev/loop901 scanned by pytest (1)",
            f"JBD2: {tag} journal recovery failed"]
    theirs = [f"EXT4-fs (loop902): {tag} mounted filesystem",
              f"BTRFS: device fsid {tag} devid 1 transid 8 /dev/loop902 scanned by pytest (1)",
              f"BTRFS error (device loop902): {tag} bad tree block"]
    with KernelLog("/dev/loop901") as log:
        assert log.available
        for line in (*ours, *theirs):
            _printk(line)
        got = [line for line in log.lines() if tag in line]
    assert got == ours
