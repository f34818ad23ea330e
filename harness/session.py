"""One recording: mkfs on a recorded device, mount, run the workload, unmount.

Shared by every host-side backend: the backend only supplies the device.
The whole life of the file system is in the log (mkfs included), so the log
replayed onto a zeroed device of the same size rebuilds every state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness import sysres
from harness.device import RecordedDevice
from harness.device_tuning import apply_tuning
from harness.errors import EnvError
from harness.filesystems import FsType
from harness.runstate import RunState
from harness.workload_runner import WorkloadRunner

MARK_MKFS = "pc:mkfs-done"      # crash points start after this mark
MARK_MOUNTED = "pc:mounted"
MARK_WORKLOAD_END = "pc:workload-end"


@dataclass
class Recording:
    log_path: str
    device_bytes: int
    sector_size: int
    workload: dict[str, Any] = field(default_factory=dict)
    final_image: str | None = None
    device_tuning: dict[str, str] = field(default_factory=dict)  # sysfs attribute -> value in force


def record(device: RecordedDevice, fs: FsType, mkfs_opts: str, mount_opts: str,
           workload: WorkloadRunner, state: RunState, out_dir: str) -> Recording:
    with device:
        tuning = apply_tuning(device.block_device, workload.device)
        p = sysres.run(fs.mkfs_cmd(device.block_device, mkfs_opts), check=False, timeout=600)
        if p.returncode != 0:
            raise EnvError(f"mkfs.{fs.name} {mkfs_opts} failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
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
    return Recording(log, device.size_bytes, device.sector_size, info, device.final_image(), tuning)

