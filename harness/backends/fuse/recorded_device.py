"""The `fuse` backend: pc-recorder (libfuse3) exposes disk.img, a loop device sits on it.

Teardown order matters (block-recording.md): the file system on the loop
device is unmounted by the caller, then `losetup -d`, then the FUSE mount
goes, and the daemon writes the end mark and exits.
"""

from __future__ import annotations

import os
import select
import subprocess

from foundation import ownership, paths, sysres
from harness.backends.device import RecordedDevice
from harness.backends.fuse.profiles import recorder_arg
from foundation.errors import EnvError
from foundation.runstate import Resource, attach_recorded_loop, spawn_recorded
from foundation.sparse import sparse_copy

READY_TIMEOUT_S = 30
LOOP_DIRECT_IO = True


class FuseRecordedDevice(RecordedDevice):
    name = "fuse"

    def __init__(self, *args, profile: dict | None = None, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.profile = profile  # the device timing pc-recorder plays (profiles.py), None: none
        self._proc: subprocess.Popen[bytes] | None = None
        self._fuse_dir = ""
        self._loop = ""
        self._res: list[Resource] = []
        self._image = ""

    @property
    def block_device(self) -> str:
        return self._loop

    @property
    def mark_file(self) -> str:
        return os.path.join(self._fuse_dir, "control")

    def final_image(self) -> str | None:
        return self._image or None

    def start(self) -> None:
        exe = paths.c_program("pc-recorder")
        sysres.require_tools("losetup", "fusermount3")
        image = self._image = os.path.join(self.state.scratch, f"device{self.tag}.img")
        fd = ownership.create_file(image, self.size_bytes)
        try:
            if self.initial_image:
                sparse_copy(self.initial_image, fd)
        finally:
            os.close(fd)
        self._fuse_dir = self.state.subdir(f"fuse{self.tag}")
        rfd, wfd = os.pipe()
        cmd = [exe, "--image", image, "--log", self.log_path,
               "--sector-size", str(self.sector_size), "--ready-fd", str(wfd)]
        if self.fault:
            cmd += ["--fault", self.fault]
        cmd += recorder_arg(self.profile)
        cmd.append(self._fuse_dir)
        # Own session: a Ctrl-C on the terminal must not kill the recorder
        # while the loop device still depends on it; teardown stops it.
        # stdout too: a recorder left behind must not hold the caller's pipe open.
        self._proc, res = spawn_recorded(self.state, cmd, "pc-recorder", pass_fds=(wfd,), start_new_session=True,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)
        os.close(wfd)
        self._res.append(res)
        self._res.append(self.state.record("fuse", path=self._fuse_dir))
        try:
            ready, _, _ = select.select([rfd], [], [], READY_TIMEOUT_S)
            got = os.read(rfd, 16) if ready else b""
        finally:
            os.close(rfd)
        if got != b"ready\n":
            err = b""
            if self._proc.poll() is not None and self._proc.stderr:
                err = self._proc.stderr.read()
            raise EnvError("pc-recorder did not start: " + (err.decode().strip().splitlines() or ["no ready signal"])[0])
        disk = os.path.join(self._fuse_dir, "disk.img")
        # Direct I/O: the loop device hands requests to FUSE asynchronously and
        # completes them in the recorder's reply, one wake-up fewer per request
        # than a loop worker blocked in a synchronous write (docs/recorder-overhead.md).
        # The log's order rules hold either way (each request is logged before it is answered).
        self._loop, res = attach_recorded_loop(self.state, disk, sector_size=self.sector_size, direct_io=LOOP_DIRECT_IO)
        self._res.append(res)

    def stop(self) -> str:
        self.close_mark_fd()
        for res in reversed(self._res):
            if res.kind == "process" and self._proc is not None:
                # The daemon exits by itself once FUSE is unmounted.
                self._proc.wait(timeout=60)
            self.state.release(res)
        self._res.clear()
        if self._proc is not None and self._proc.returncode not in (0, None):
            err = self._proc.stderr.read().decode().strip() if self._proc.stderr else ""
            raise EnvError(f"pc-recorder exited with {self._proc.returncode}: {err.splitlines()[0] if err else ''}")
        return self.log_path
