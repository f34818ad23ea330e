"""Backends, by name: how a run's recording is made and who recovers crash images.

`fuse` and `dm` are RecordedDevices the host makes the file system on
(harness/backends/session.py): pc-recorder's FUSE stand-in, or the host
kernel's own dm-log-writes (harness/backends/dm/). `vm` runs the whole
recording in a QEMU guest with the guest kernel's dm-log-writes and lets
that kernel recover the crash images (harness/backends/vm/). `auto` is dm
where the host has it, fuse elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from checkers.crashwalk.recovery import PointInspect, RecoveryEngine
from checkers.crashwalk.recovery_crash import RecordRecovery
from harness.backends.device import RecordedDevice
from foundation.errors import UsageError
from foundation.filesystems import FsType
from foundation.runstate import RunState
from harness.backends.session import FAULTS, DeviceBackend, Recording
from workloads.runner import WorkloadRunner

BACKENDS = ("fuse", "dm", "vm", "auto")
NEEDS_KERNEL = "--backend vm needs --kernel debian:PACKAGE (e.g. debian:linux-image-6.12-amd64) or --kernel PATH"


def check_kernel_args(name: str, kernel: str | None, kernel_modules: str | None) -> None:
    """--kernel and --kernel-modules go with --backend vm, and vm needs --kernel."""
    if name == "vm" and not kernel:
        raise UsageError(NEEDS_KERNEL)
    if name != "vm" and (kernel or kernel_modules):
        raise UsageError("--kernel and --kernel-modules need --backend vm")


@dataclass(frozen=True)
class DeviceArgs:
    """`--backend dm` on devices the user names (harness/backends/dm/devices.py)."""
    data_dev: str | None = None
    log_dev: str | None = None
    erase_ok: tuple[str, ...] = ()   # --i-know-this-erases DEV, repeated

    def given(self) -> bool:
        return bool(self.data_dev or self.log_dev or self.erase_ok)


class Backend(Protocol):
    def record(self, fs: FsType, mkfs_opts: str, mount_opts: str, workload: WorkloadRunner,
               state: RunState, out_dir: str, device_bytes: int, log_path: str) -> Recording:
        """Make the file system, run WORKLOAD on it and return the finished log."""

    def recovery(self, fs: FsType, mount_opts: str, state: RunState,
                 inspect: PointInspect | None = None) -> RecoveryEngine | None:
        """The engine that recovers crash images (INSPECT reads each recovered one); None: the host kernel."""

    def recovery_recorder(self, fs: FsType, state: RunState, device_bytes: int) -> RecordRecovery:
        """Records a recovery mount of a crash image on the recorded device (--recovery-crash)."""

    def report_extra(self) -> dict[str, Any]:
        """Backend facts for report.json."""


# Gives the backend of one run (a campaign worker's live vm guest: harness/backends/vm.py LiveVm.open).
BackendOpener = Callable[[FsType, WorkloadRunner], Backend]
def resolve(name: str) -> str:
    """The backend NAME stands for: `auto` is dm where this kernel has dm-log-writes, else fuse."""
    if name != "auto":
        return name
    from harness.backends.dm import support
    return "fuse" if support.missing() else "dm"


def require(name: str) -> None:
    """Stop with one line if backend NAME (resolved) cannot record on this host: campaigns check
    once, before their directory or any worker exists."""
    if name == "dm":
        from harness.backends.dm import support
        support.require()


def backend_class(name: str) -> type[RecordedDevice]:
    if name == "fuse":
        from harness.backends.fuse.recorded_device import FuseRecordedDevice
        return FuseRecordedDevice
    if name == "dm":
        from harness.backends.dm.recorded_device import DmRecordedDevice
        return DmRecordedDevice
    raise UsageError(f"unknown --backend {name!r}: available: {', '.join(BACKENDS)}")


def open_backend(name: str, fs: FsType, workload: WorkloadRunner, *, fault: str | None = None,
                 kernel: str | None = None, kernel_modules: str | None = None,
                 devices: DeviceArgs | None = None, profile: dict[str, Any] | None = None) -> Backend:
    """The backend NAME (resolved: not `auto`), checked and prepared before anything is created
    (a vm kernel is fetched, the user's devices of the dm backend are checked here)."""
    devices = devices or DeviceArgs()
    if profile and name != "fuse":
        raise UsageError("--device-profile is played by the fuse recorder: it needs --backend fuse")
    if name != "dm" and devices.given():
        raise UsageError("--data-dev, --log-dev and --i-know-this-erases need --backend dm")
    check_kernel_args(name, kernel, kernel_modules)
    if name == "vm":
        from harness.backends.vm.backend import VmBackend
        return VmBackend(fs, workload, kernel, kernel_modules, fault)
    if name == "dm":
        from harness.backends.dm import devices as dm_devices, support
        if fault:
            raise UsageError("--fault is a test mode of the fuse recorder; --backend dm records with the kernel's dm-log-writes")
        user = dm_devices.user_devices(devices.data_dev, devices.log_dev, list(devices.erase_ok))
        support.require()
        return DeviceBackend(backend_class(name), None, {"user": user})
    if fault and fault not in FAULTS:
        raise UsageError(f"--fault {fault} needs --backend vm")
    return DeviceBackend(backend_class(name), fault, {"profile": profile} if profile else {})
