"""What may have changed on a crash-walk worker's device since its previous inspection.

A worker (checkers/crashwalk/slot.py) inspects one recovered image after another
on the same mount point. Before each inspection it publishes here, for that
mount point, the device byte ranges that may differ from the device at its
previous inspection (the log's changes plus everything the kernel wrote,
checkers/crashwalk/slot.py), or None when it does not know. An inspector that
remembers what it read last time (the content oracle) may then reuse what
lies wholly outside those ranges; anything else it reads again.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceChanges:
    slot: str                                 # which worker (unique per CheckSlot)
    seq: int                                  # its inspections so far, this one included
    ranges: tuple[tuple[int, int], ...] | None  # sorted, merged (start, end) bytes; None: unknown

    def touches(self, start: int, end: int) -> bool:
        """Whether [start, end) overlaps a changed range (always, when the changes are unknown)."""
        if self.ranges is None:
            return True
        k = bisect.bisect_right(self.ranges, (start, float("inf")))
        return (k > 0 and self.ranges[k - 1][1] > start) or (k < len(self.ranges) and self.ranges[k][0] < end)

    def untouched(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) no changed range overlaps (none, when the changes are unknown)."""
        if self.ranges is None:
            return []
        out, cur = [], start
        k = max(0, bisect.bisect_right(self.ranges, (start, float("inf"))) - 1)
        while k < len(self.ranges) and self.ranges[k][0] < end:
            s, t = self.ranges[k]
            if t > cur:
                if s > cur:
                    out.append((cur, s))
                cur = max(cur, t)
            k += 1
        if cur < end:
            out.append((cur, end))
        return out

    def follows(self, slot: str, seq: int) -> bool:
        """Whether these are the changes since inspection SEQ of SLOT (so what was read then can be reused)."""
        return self.ranges is not None and self.slot == slot and self.seq == seq + 1


_published: dict[str, DeviceChanges] = {}


def publish(mnt: str, changes: DeviceChanges) -> None:
    _published[mnt] = changes


def retract(mnt: str) -> None:
    _published.pop(mnt, None)


def since_last(mnt: str) -> DeviceChanges | None:
    """The changes published for the image mounted at MNT, if its worker publishes any."""
    return _published.get(mnt)
