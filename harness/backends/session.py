"""One recording: mkfs on a recorded device, mount, run the workload, unmount.

Shared by every host-side backend: the backend only supplies the device.
The whole life of the file system is in the log (mkfs included), so the log
replayed onto a zeroed device of the same size rebuilds every state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from checkers.crashwalk.recovery import PointInspect
from foundation import kmount, sysres
from harness.backends.device import RecordedDevice
from harness.backends.engine import Engine, Option, fault_choices
from harness.backends.recording import Recording
from harness.backends.tuning import tuned
from foundation.errors import EnvError
from foundation.filesystems import FsType, host_kernel_lacks, join_opts
from foundation.runstate import RunState
from workloads.marks import MARK_MKFS, MARK_MOUNTED, MARK_WORKLOAD_END
from workloads.runner import WorkloadRunner

if TYPE_CHECKING:
    from checkers.crashwalk.recovery_crash import RecordRecovery

MARK_RECOVERY_MOUNTED = "pc:recovery-mounted"   # in a recovery recording: the recovery mount returned
# --fault modes: which recording makes the recorder lie (it drops flushes).
FAULTS = {"drop-flush": "workload", "recovery-drop-flush": "recovery"}
# --fault: declared by the engines with test faults (fuse, vm); dm has none.
FAULT = Option("fault", "--fault", choices=fault_choices, scope="test",
               needs="--fault is a test mode of the fuse recorder; --backend dm records with the kernel's dm-log-writes",
               help="test-only: make the recorder lie (drop-flush: flushes are acknowledged but not logged; with "
                    "--backend vm, left out of the kernel's log; recovery-drop-flush: the same, only while a recovery "
                    "is recorded for --recovery-crash); --backend vm also: recovery-panic (the guest kernel crashes "
                    "at the first recovery mount of every batch), recovery-hang (that mount waits for I/O that never "
                    "completes: the live guest's hang watchdog, POWERCUT_VM_HANG_S), coverage-plant (a planted kernel finding "
                    "for every workload whose path ran POWERCUT_VM_PLANT_FUNCTIONS, default 300, functions of the file "
                    "system's modules)")

def record(device: RecordedDevice, fs: FsType, mkfs_opts: str, mount_opts: str,
           workload: WorkloadRunner, state: RunState, out_dir: str) -> Recording:
    lacks = host_kernel_lacks(fs.name)
    if lacks:  # the host kernel mounts here: say so before a recorder is set up for nothing
        raise EnvError(f"{fs.name} on this host: {lacks}; the vm backend runs it in a guest kernel "
                       f"(--backend vm --kernel debian:PACKAGE)")
    with device:
        with tuned(device.block_device, workload.device) as tuning:
            fs.make(device.block_device, mkfs_opts)
            device.mark(MARK_MKFS)
            mnt = state.subdir("mnt")
            mount_res = state.record("mount", path=mnt)
            p = sysres.mount(device.block_device, mnt, fs.name, mount_opts)
            if p.returncode != 0:
                state.released(mount_res)
                raise EnvError(f"mount -o {mount_opts or 'defaults'} failed: {(p.stderr or p.stdout).strip()}")
            device.mark(MARK_MOUNTED)
            try:
                info = workload.run(mnt, device.mark_file, out_dir, state)
                device.mark(MARK_WORKLOAD_END)
            finally:
                state.release(mount_res)
        log = device.stop()
    return Recording(log, device.size_bytes, device.sector_size, info, device.final_image(), device_tuning=tuning)


def record_recovery(device: RecordedDevice, fs: FsType, mount_opts: str, state: RunState) -> bool:
    """Record one recovery: mount DEVICE's crash image (the kernel recovers it), unmount.

    Returns False when the kernel refuses the mount (then there is no
    recovery to crash in; the crash walk reports the failed mount itself).
    """
    with device:
        mnt = state.subdir(f"mnt-recovery{device.tag}")
        mount_res = state.record("mount", path=mnt)
        try:
            # (with the recovery options of every crash-image mount: xfs needs nouuid
            # while other workers have images of the same file system mounted)
            kmount.mount(device.block_device, mnt, fs.name, join_opts(mount_opts, fs.recovery_opts))
            device.mark(MARK_RECOVERY_MOUNTED)
            mounted = True
        except kmount.MountError:
            mounted = False
        finally:
            kmount.umount(mnt)
            state.released(mount_res)
        device.stop()
    return mounted


@dataclass
class DeviceBackend:
    """A host-side backend: it supplies the recorded device, the host does the rest."""

    device_cls: type[RecordedDevice]
    fault: str | None = None
    device_opts: dict[str, Any] = field(default_factory=dict)  # extra arguments of device_cls

    def record(self, fs: FsType, mkfs_opts: str, mount_opts: str, workload: WorkloadRunner,
               state: RunState, out_dir: str, device_bytes: int, log_path: str) -> Recording:
        device = self.device_cls(state, device_bytes, log_path, fault=self._fault("workload"), **self.device_opts)
        return record(device, fs, mkfs_opts, mount_opts, workload, state, out_dir)

    def _fault(self, recording: str) -> str | None:
        return "drop-flush" if self.fault and FAULTS[self.fault] == recording else None

    def recovery_recorder(self, fs: FsType, state: RunState, device_bytes: int) -> "RecordRecovery":
        """Records recovery mounts of crash images on this backend's recorded device."""
        def record_one(image: str, mount_opts: str, log_path: str, tag: str) -> bool:
            device = self.device_cls(state, device_bytes, log_path, fault=self._fault("recovery"),
                                     initial_image=image, tag=tag)
            return record_recovery(device, fs, mount_opts, state)
        return record_one

    def recovery(self, fs: FsType, mount_opts: str, state: RunState, inspect: PointInspect | None = None) -> None:
        return None  # the host kernel recovers crash images (checkers/crashwalk/recovery.py)

    def report_extra(self) -> dict[str, Any]:
        profile = self.device_opts.get("profile")
        return {"device_profile": profile} if profile else {}


class DeviceEngine(Engine):
    """A host-side engine: it supplies the recorded device (DEVICE_CLS), the host does the rest (`record`)."""

    device_cls: ClassVar[type[RecordedDevice]]

    def calibration_device(self, opts: Any) -> type[RecordedDevice] | None:
        return self.device_cls
