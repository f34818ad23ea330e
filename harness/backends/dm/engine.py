"""The `dm` engine: the host kernel's own dm-log-writes, on loop devices or the user's block devices."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from foundation.filesystems import FsType
from harness.backends.device import RecordedDevice
from harness.backends.dm import devices, support
from harness.backends.dm.devices import CONFIRM_FLAG
from harness.backends.dm.recorded_device import DmRecordedDevice
from harness.backends.engine import Option, register_engine
from harness.backends.session import DeviceBackend, DeviceEngine
from workloads.runner import WorkloadRunner

_NEEDS_DM = "--data-dev, --log-dev and --i-know-this-erases need --backend dm"


@dataclass(frozen=True)
class DmOptions:
    """Recording on devices the user names (devices.py); none: loop devices on new files."""
    data_dev: str | None = None
    log_dev: str | None = None
    erase_ok: tuple[str, ...] = ()   # --i-know-this-erases DEV, repeated

    def given(self) -> bool:
        return bool(self.data_dev or self.log_dev or self.erase_ok)


class DmEngine(DeviceEngine):
    name = "dm"
    summary = "the host kernel's own dm-log-writes on loop devices"
    logs_writes_at_flush = True
    options = (Option("data_dev", "--data-dev", metavar="DEV", needs=_NEEDS_DM, scope="one-run",
                      help="--backend dm: record on this block device (erased; default: a loop device on a new file)"),
               Option("log_dev", "--log-dev", metavar="DEV", needs=_NEEDS_DM, scope="one-run",
                      help="--backend dm with --data-dev: the log's block device (erased)"),
               Option("erase_ok", CONFIRM_FLAG, default=(), action="append", metavar="DEV", needs=_NEEDS_DM,
                      scope="one-run",
                      help="confirm that DEV (--data-dev or --log-dev) may be erased; needed for each"))
    device_cls = DmRecordedDevice

    def parse(self, values: Mapping[str, Any]) -> DmOptions:
        return DmOptions(values["data_dev"], values["log_dev"], tuple(values["erase_ok"] or ()))

    def require(self) -> None:
        support.require()

    def open(self, fs: FsType, workload: WorkloadRunner, opts: DmOptions) -> DeviceBackend:
        user = devices.user_devices(opts.data_dev, opts.log_dev, list(opts.erase_ok))
        support.require()
        return DeviceBackend(DmRecordedDevice, None, {"user": user})

    def calibration_device(self, opts: DmOptions) -> type[RecordedDevice] | None:
        # On the user's own devices the run's storage is not the loop devices a
        # calibration would compare: no figure rather than a wrong one.
        return None if opts.given() else DmRecordedDevice


register_engine(DmEngine())
