"""The `dm` backend's recorded device: the kernel's log-writes target over a data and a log device.

By default both are loop devices on files powercut creates in the run's
scratch directory (the log's entries are copied to OUT at the end); with --data-dev
and --log-dev they are the user's block devices (checked in devices.py,
the data device zeroed first). Every step goes through pc-dmlog, the
program the vm guest runs too. The run journal records the target (name,
uuid, table) before it exists, so teardown and `powercut cleanup` remove it.

Teardown order: the mark file system, then the target (the kernel appends
`dm-log-writes-end`), then the loop devices.
"""

from __future__ import annotations

import os

from harness.backends.device import RecordedDevice
from harness.backends.dm import devices, support
from harness.backends.dm.devices import UserDevices
from harness.backends.dm.logdisk import copy_log, log_disk_bytes
from foundation import ownership, paths, sysres
from foundation.errors import EnvError
from foundation.runstate import Resource, attach_recorded_loop

SECTOR = 512  # device-mapper tables count 512-byte sectors whatever the devices' block size


class DmRecordedDevice(RecordedDevice):
    name = "dm"

    def __init__(self, *args, user: UserDevices | None = None, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.user = user
        self._dev = ""
        self._marks = ""
        self._image = ""
        self._log_disk = ""
        self._res: list[Resource] = []

    @property
    def block_device(self) -> str:
        return self._dev

    @property
    def mark_file(self) -> str:
        return os.path.join(self._marks, "mark")

    def final_image(self) -> str | None:
        return self._image or None

    def scratch_files(self) -> list[str]:
        return [p for p in (self._image, self._log_disk) if p]

    def _loop_on_new_file(self, path: str, size: int) -> str:
        os.close(ownership.create_file(path, size))
        dev, res = attach_recorded_loop(self.state, path, sector_size=self.sector_size)
        self._res.append(res)
        return dev

    def _devices(self) -> tuple[str, str]:
        if self.user is None:
            self._image = os.path.join(self.state.scratch, f"device{self.tag}.img")
            data = self._loop_on_new_file(self._image, self.size_bytes)
            # The log disk lives in scratch too, beside the data image, not in
            # OUT: OUT may be on any file system (NFS, 9p) and loop devices are
            # only as good as the file system under them.
            self._log_disk = os.path.join(self.state.scratch, f"log-disk{self.tag}.img")
            return data, self._loop_on_new_file(self._log_disk, log_disk_bytes(self.size_bytes))
        data, log = self.user.data, self.user.log
        if devices.size_bytes(data) < self.size_bytes:
            raise EnvError(f"--data-dev {data} has {devices.size_bytes(data)} bytes, the run needs {self.size_bytes} "
                           "(lower --size)")
        self.sector_size = devices.sector_size(log)  # the log's sector size is the kernel's log block
        devices.zero_out(data, self.size_bytes)
        devices.zero_out(log, min(devices.size_bytes(log), 1 << 20))  # no stale super block
        return data, log

    def start(self) -> None:
        exe = paths.c_program("pc-dmlog")
        support.require()
        data, log = self._devices()
        name = f"powercut-{self.state.run_id}{self.tag}-{len(self._res)}"
        sectors = self.size_bytes // SECTOR
        self._res.append(self.state.record("dm", name=name, uuid=name, table=f"0 {sectors} log-writes {data} {log}"))
        self._dev = sysres.run([exe, "create", name, name, str(sectors), data, log], timeout=60).stdout.strip()
        self._marks = self.state.subdir(f"marks-{name}")
        self._res.append(self.state.record("fuse", path=self._marks))
        sysres.run([exe, "markfs", name, self._marks], timeout=60)

    def stop(self) -> str:
        self.close_mark_fd()
        for res in reversed(self._res):
            self.state.release(res)
        self._res.clear()
        copy_log(self.user.log if self.user is not None else self._log_disk, self.log_path)
        return self.log_path
