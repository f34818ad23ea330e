"""The `fuse` engine: pc-recorder's FUSE stand-in for a block device, on any host (recorded_device.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from foundation.errors import UsageError
from foundation.filesystems import FsType
from harness.backends.engine import Option, register_engine
from harness.backends.fuse.profiles import resolve as resolve_profile
from harness.backends.fuse.recorded_device import FuseRecordedDevice
from harness.backends.session import FAULT, FAULTS, DeviceBackend, DeviceEngine
from workloads.runner import WorkloadRunner

PROFILE = Option("device_profile", "--device-profile", metavar="NAME|FILE.json", scope="one-run",
                 needs="--device-profile is played by the fuse recorder: it needs --backend fuse",
                 help="fuse backend: the recorder plays this device's timing: emmc, sata-hdd, ufs, nvme, none, "
                      "or a JSON file of read_us, write_us, flush_us, discard_us, mbps, qd (docs/device-profiles.md)")


@dataclass(frozen=True)
class FuseOptions:
    device_profile: str | None = None   # NAME or FILE.json: the device timing the recorder plays
    fault: str | None = None            # a test mode: the recorder drops flushes (session.FAULTS)
    profile: dict[str, Any] | None = field(default=None, compare=False)  # device_profile, read


class FuseEngine(DeviceEngine):
    name = "fuse"
    summary = "the host kernel through the userspace recorder (default)"
    options = (PROFILE, FAULT)
    faults = tuple(FAULTS)
    records_recovery = True
    device_cls = FuseRecordedDevice

    def parse(self, values: Mapping[str, Any]) -> FuseOptions:
        fault = values["fault"]
        if fault and fault not in FAULTS:
            raise UsageError(f"--fault {fault} needs --backend vm")
        return FuseOptions(values["device_profile"], fault, resolve_profile(values["device_profile"]))

    def open(self, fs: FsType, workload: WorkloadRunner, opts: FuseOptions) -> DeviceBackend:
        return DeviceBackend(FuseRecordedDevice, opts.fault, {"profile": opts.profile} if opts.profile else {})


register_engine(FuseEngine())
