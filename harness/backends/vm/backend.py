"""The `vm` backend: the real dm-log-writes, in a QEMU guest running the kernel under test.

One boot records: dm-log-writes over two virtio disks (data, log), mkfs,
the marks, mount, the workload, umount, target removal (the kernel appends
`dm-log-writes-end`), power off (guest side: harness/backends/vm/guest/record.sh).
The host then reads the log disk with the same LogReader as any other log,
replays crash states itself, and hands them back to the guest kernel for
recovery (harness/backends/vm/recovery.py). Program workloads run under busybox
sh; JSON workloads run in build/pc-exec in the guest, whose records file
comes back over a third disk as OUT/records.bin.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from checkers.recovery import PointInspect
from harness.backends.dm.logdisk import finish_log, log_disk_bytes
from harness.backends.vm.recovery import VmRecovery
from harness.foundation import ownership
from harness.foundation.errors import EnvError, UsageError
from harness.foundation.filesystems import FsType
from harness.foundation.runstate import RunState
from harness.backends.session import Recording
from workloads.marks import MARK_MKFS, MARK_MOUNTED, MARK_WORKLOAD_END
from harness.backends.vm import initramfs, kernel as vmkernel, packages
from harness.backends.vm.qemu import Disk, Guest
from workloads.runner import (RECORDS_FILE, SYSCTLS, ExecutorWorkload, ExternalProgram, WorkloadRunner,
                                     check_executor_exit)

# Every guest boot must end within this (seconds); override with POWERCUT_VM_TIMEOUT.
BOOT_TIMEOUT_S = float(os.environ.get("POWERCUT_VM_TIMEOUT", "900"))
SECTOR_SIZE = 512  # virtio-blk's default logical block size: the log's sectorsize
# A JSON workload's plan and records in the guest; the records come back on /dev/vdc.
GUEST_PLAN = "/pc/plan"
GUEST_RECORDS = "/tmp/records.bin"
RECORDS_DISK_BYTES = 1 << 30  # sparse: only what the executor writes is allocated
CONTENT_CHECKS = ("guest kernel recovers (mount + umount); host fsck, then the content oracle reads a "
                  "read-only host mount of the recovered image (no replay by the host kernel)")
EXECUTOR_COMMAND = f'/usr/bin/pc-exec --plan {GUEST_PLAN} --dir /mnt --out {GUEST_RECORDS} --mark-file "$POWERCUT_MARK_FILE"'


def guest_command(workload: WorkloadRunner) -> str:
    """How the guest runs the workload (a program is copied to /pc/workload; busybox sh evals this)."""
    if isinstance(workload, ExecutorWorkload):
        return EXECUTOR_COMMAND
    if not isinstance(workload, ExternalProgram):
        raise UsageError(f"--backend vm cannot run workload {workload.name!r} in the guest")
    ext = os.path.splitext(workload.path)[1]
    if ext == ".py":
        raise UsageError(f"workload {workload.path}: the vm guest has no Python; use a busybox sh script")
    return "sh /pc/workload" if ext == ".sh" else "/pc/workload"


class VmBackend:
    def __init__(self, fs: FsType, workload: WorkloadRunner, kernel: str | None,
                 kernel_modules: str | None, fault: str | None) -> None:
        if fault:
            raise UsageError("--fault is a test mode of the fuse recorder; the vm backend records with the kernel's dm-log-writes")
        if not kernel:
            raise UsageError("--backend vm needs --kernel debian:PACKAGE (e.g. debian:linux-image-6.12-amd64) or --kernel PATH")
        self.workload = workload
        self.command = guest_command(workload)
        packages.ensure(packages.VM_HOST_PACKAGES, "--backend vm")
        self.kernel = vmkernel.resolve(kernel, kernel_modules)
        self.base_initrd = initramfs.build(self.kernel, fs)
        self.guest: Guest | None = None
        self.mkfs = shlex.join([initramfs.which(fs.mkfs[0]), *fs.mkfs[1:]])

    def _guest(self, state: RunState, out_dir: str) -> Guest:
        if self.guest is None:
            self.guest = Guest(self.kernel, self.base_initrd, state, out_dir)
        return self.guest

    def record(self, fs: FsType, mkfs_opts: str, mount_opts: str, workload: WorkloadRunner,
               state: RunState, out_dir: str, device_bytes: int, log_path: str) -> Recording:
        data = os.path.join(state.scratch, "device.img")
        for path, size in ((data, device_bytes), (log_path, log_disk_bytes(device_bytes))):
            os.close(ownership.create_file(path, size))
        files, disks, extra_env = self._workload_inputs(state, out_dir)
        env = {"PC_FS": fs.name, "PC_MKFS": f"{self.mkfs} {mkfs_opts}".strip(), "PC_MOUNT_OPTS": mount_opts,
               "PC_WORKLOAD": self.command, "PC_MARK_MKFS": MARK_MKFS, "PC_MARK_MOUNTED": MARK_MOUNTED,
               "PC_MARK_END": MARK_WORKLOAD_END, **extra_env}
        output = os.path.join(out_dir, "workload.out")
        outcome = self._guest(state, out_dir).boot("record", env, [Disk(data, discard=True), Disk(log_path), *disks],
                                                   timeout=BOOT_TIMEOUT_S, files=files, output=output)
        if not outcome.completed:
            raise EnvError(f"the guest stopped before the recording finished: last console line: {outcome.console_tail}")
        finish_log(log_path)
        words = dict(line.split(" ", 1) for line in outcome.lines if " " in line and not line.startswith("sysctl "))
        code = int(words["workload-exit"])
        if isinstance(self.workload, ExecutorWorkload):
            check_executor_exit(code, output)
            self._fetch_records(disks[0].path, int(words.get("records", "-1")), out_dir)
            sysctls = dict(line.split(" ", 2)[1:] for line in outcome.lines if line.startswith("sysctl "))
            info = self.workload.info(sysctls)
        else:
            info = {"type": "program", "command": shlex.split(self.command), "exit_code": code,
                    "output": os.path.basename(output)}
        return Recording(log_path, device_bytes, SECTOR_SIZE, info, final_image=data, kernel=outcome.kernel)

    def _workload_inputs(self, state: RunState, out_dir: str) -> tuple[dict[str, bytes], list[Disk], dict[str, str]]:
        """Files under /pc, extra disks and job variables the workload needs in the guest."""
        if isinstance(self.workload, ExecutorWorkload):
            with open(self.workload.save_inputs(out_dir), "rb") as f:
                plan = f.read()
            records = os.path.join(state.scratch, "records-disk.img")
            os.close(ownership.create_file(records, RECORDS_DISK_BYTES))
            env = {"PC_RECORDS": GUEST_RECORDS, "PC_SYSCTLS": " ".join(SYSCTLS)}
            return {os.path.basename(GUEST_PLAN): plan}, [Disk(records)], env
        assert isinstance(self.workload, ExternalProgram)
        with open(self.workload.path, "rb") as f:
            return {"workload": f.read()}, [], {}

    @staticmethod
    def _fetch_records(disk: str, size: int, out_dir: str) -> None:
        """The executor's records, copied off the guest's records disk to OUT/records.bin."""
        if size < 0:
            raise EnvError("the guest reported no records file: pc-exec wrote none")
        with open(disk, "rb") as src, os.fdopen(ownership.create_file(os.path.join(out_dir, RECORDS_FILE)), "wb") as dst:
            dst.write(src.read(size))  # a few bytes per op: small

    def recovery(self, fs: FsType, mount_opts: str, state: RunState,
                 inspect: PointInspect | None = None) -> VmRecovery:
        if self.guest is None:
            raise RuntimeError("recovery() before record()")
        return VmRecovery(self.guest, fs, mount_opts, state, timeout=BOOT_TIMEOUT_S, inspect=inspect)

    def report_extra(self) -> dict[str, Any]:
        guest = self.guest
        vm: dict[str, Any] = {"kernel_spec": self.kernel.label, "accel": guest.accel if guest else None,
                              "boot_seconds": guest.boots if guest else []}
        if isinstance(self.workload, ExecutorWorkload):
            vm["content_checks"] = CONTENT_CHECKS
        return {"vm": vm}
