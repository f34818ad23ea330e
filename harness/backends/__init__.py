"""Backends, by name: how a run's recording is made and who recovers crash images.

`fuse` (and any other host-side device) is a RecordedDevice the host makes
the file system on (harness/backends/session.py). `vm` runs the whole recording in a
QEMU guest with the real dm-log-writes and lets the guest kernel recover the
crash images (harness/backends/vm.py).
"""

from __future__ import annotations

from typing import Any, Protocol

from checkers.recovery import PointInspect, RecoveryEngine
from harness.backends.device import RecordedDevice
from harness.foundation.errors import UsageError
from harness.foundation.filesystems import FsType
from harness.foundation.runstate import RunState
from harness.backends.session import DeviceBackend, Recording
from workloads.runner import WorkloadRunner

BACKENDS = ("fuse", "vm")


class Backend(Protocol):
    def record(self, fs: FsType, mkfs_opts: str, mount_opts: str, workload: WorkloadRunner,
               state: RunState, out_dir: str, device_bytes: int, log_path: str) -> Recording:
        """Make the file system, run WORKLOAD on it and return the finished log."""

    def recovery(self, fs: FsType, mount_opts: str, state: RunState,
                 inspect: PointInspect | None = None) -> RecoveryEngine | None:
        """The engine that recovers crash images (INSPECT reads each recovered one); None: the host kernel."""

    def report_extra(self) -> dict[str, Any]:
        """Backend facts for report.json."""


def backend_class(name: str) -> type[RecordedDevice]:
    if name == "fuse":
        from harness.backends.fuse.recorded_device import FuseRecordedDevice
        return FuseRecordedDevice
    raise UsageError(f"unknown --backend {name!r}: available: {', '.join(BACKENDS)}")


def open_backend(name: str, fs: FsType, workload: WorkloadRunner, *, fault: str | None = None,
                 kernel: str | None = None, kernel_modules: str | None = None) -> Backend:
    """The backend NAME, checked and prepared (a vm kernel is fetched here) before anything is created."""
    if name == "vm":
        from harness.backends.vm.backend import VmBackend
        return VmBackend(fs, workload, kernel, kernel_modules, fault)
    if kernel or kernel_modules:
        raise UsageError("--kernel and --kernel-modules need --backend vm")
    return DeviceBackend(backend_class(name), fault)
