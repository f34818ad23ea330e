"""Recorded-device backends, by name."""

from __future__ import annotations

from harness.device import RecordedDevice
from harness.errors import UsageError


def backend_class(name: str) -> type[RecordedDevice]:
    if name == "fuse":
        from harness.backends.fuse import FuseRecordedDevice
        return FuseRecordedDevice
    raise UsageError(f"unknown --backend {name!r}: available: fuse")
