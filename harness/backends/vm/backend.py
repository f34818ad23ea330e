"""The `vm` backend: the real dm-log-writes, in a QEMU guest running the kernel under test.

One boot records: dm-log-writes over two virtio disks (data, log), mkfs,
the marks, mount, the workload, umount, target removal (the kernel appends
`dm-log-writes-end`), power off (guest side: harness/backends/vm/guest/record.sh).
The host then reads the log disk with the same LogReader as any other log,
replays crash states itself, and hands them back to the guest kernel for
recovery (harness/backends/vm/recovery.py). Program workloads run under busybox
sh; JSON workloads run in build/pc-exec in the guest, whose records file
comes back over a third disk as OUT/records.bin.

With a LiveVm (fuzz campaigns: `LiveVm.open` is the pipeline's backend
opener), the guest is booted once and serves every workload
(harness/backends/vm/live.py): the host makes the file system once per
configuration, copies it onto the guest's data disk before each recording
and puts it at the head of the log (replay/logsplice.py). A guest that dies
or hangs during the workload ends the run with a `kernel` finding
(KernelFailure); a WARNING/BUG report on its console during the workload is
a `kernel` finding next to the crash walk's.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from checkers.findings import kernel_finding
from checkers.crashwalk.recovery import PointInspect
from harness.backends.dm.logdisk import finish_log, log_disk_bytes, log_end
from harness.backends.vm.recovery import MAX_IMAGES_PER_BOOT, VmRecovery, state_profile
from foundation import ownership
from foundation.errors import EnvError, KernelFailure, UsageError
from foundation.filesystems import FsType, host_kernel_lacks
from foundation.runstate import RunState
from foundation.sparse import copy_range
from harness.backends.recording import Recording
from workloads.marks import MARK_MKFS, MARK_MOUNTED, MARK_WORKLOAD_END
from harness.backends.vm import coverage, initramfs, kernel as vmkernel, packages
from harness.backends.vm.live import LiveGuest
from harness.backends.vm.qemu import Disk, Guest, Outcome
from workloads.runner import RECORDS_FILE, SYSCTLS, GuestPaths, WorkloadRunner
from replay.logformat import LogReader
from replay.logsplice import image_prefix, splice
from replay.replayer import log_differs_from

# Every guest boot must end within this (seconds); override with POWERCUT_VM_TIMEOUT.
BOOT_TIMEOUT_S = float(os.environ.get("POWERCUT_VM_TIMEOUT", "900"))
SECTOR_SIZE = 512  # virtio-blk's default logical block size: the log's sectorsize
# A JSON workload's plan and records in the guest; the records come back on /dev/vdc.
GUEST_RECORDS = "/tmp/records.bin"
RECORDS_DISK_BYTES = 1 << 30  # sparse: only what the executor writes is allocated
# Of the vm engine's --fault modes (vm/engine.py FAULTS, checked there once): those a recovery plays.
RECOVERY_FAULTS = ("recovery-panic", "recovery-hang")
CONTENT_CHECKS = ("guest kernel recovers (mount + umount); host fsck, then the content oracle reads a "
                  "read-only host mount of the recovered image (no replay by the host kernel)")
CONTENT_CHECKS_IN_GUEST = ("guest kernel recovers (mount), reads the recovered tree for the content oracle "
                           "(pc-dump, rebuilt on the host) and unmounts; host fsck")
# POWERCUT_CONTENT_READER=guest: the guest reads every file system for the oracle, also one the
# host could mount (to compare the two paths and measure them, docs/vm-backend.md).


def guest_reads(fs: FsType) -> bool:
    """Whether the guest reads the recovered images for the content oracle (the host cannot mount FS)."""
    return os.environ.get("POWERCUT_CONTENT_READER") == "guest" or bool(host_kernel_lacks(fs.name))


# Where the guest keeps what runs a workload (the inputs under /pc: guest/init's layout).
GUEST_PATHS = GuestPaths(inputs="/pc", exe="/usr/bin/pc-exec", mount="/mnt", records=GUEST_RECORDS)


@dataclass
class FreshFs:
    """A file system made on the host once, and the log entries that make it on a zeroed device."""

    image: str
    prefix: str


def prepare_host(kernel: str, kernel_modules: str | None) -> None:
    """What every guest of a campaign needs from the host, done once before its workers start:
    the host packages (installed under a lock) and the kernel (downloaded into the cache).
    Raises UsageError/EnvError: the campaign ends with that one line, no worker started."""
    packages.ensure(packages.vm_host_packages(), "--backend vm")
    vmkernel.resolve(kernel, kernel_modules)


class LiveVm:
    """The live guests of one campaign worker or corpus job: one per device size, booted on
    first use, serving every file system in FSS (one initramfs carries their tools and modules).
    Only one guest runs at a time: switching sizes powers the other off (its disks stay).
    KERNEL and FAULT come checked from the engine's options (vm/engine.py VmEngine.parse)."""

    def __init__(self, kernel: str, kernel_modules: str | None, fss: Sequence[FsType],
                 fault: str | None) -> None:
        packages.ensure(packages.vm_host_packages(), "--backend vm")
        self.kernel = vmkernel.resolve(kernel, kernel_modules)
        self.fs_names = sorted({f.name for f in fss})
        self.fault = fault
        self.state_profile: dict[str, float] = {}   # VmRecovery.profile, summed over this worker's runs
        self.base_initrd = initramfs.build(self.kernel, sorted(fss, key=lambda f: f.name))
        self.guests: dict[int, LiveGuest] = {}
        self.fresh: dict[tuple[str, str, int], FreshFs] = {}

    def open(self, fs: FsType, workload: WorkloadRunner) -> "VmBackend":
        """The backend for one workload (the pipeline's opener)."""
        if fs.name not in self.fs_names:
            raise UsageError(f"this live guest is for {', '.join(self.fs_names)}, not {fs.name}")
        return VmBackend(fs, workload, None, None, self.fault, live=self)

    def guest(self, device_bytes: int) -> LiveGuest:
        if device_bytes not in self.guests:
            self.guests[device_bytes] = LiveGuest(self.kernel, self.base_initrd, device_bytes,
                                                  log_disk_bytes(device_bytes), MAX_IMAGES_PER_BOOT)
        for size, other in self.guests.items():
            if size != device_bytes:
                other.stop()  # one QEMU per worker: its memory is the host's scarcest resource here
        return self.guests[device_bytes]

    def fresh_fs(self, fs: FsType, mkfs_opts: str, device_bytes: int) -> FreshFs:
        """The file system FS for MKFS_OPTS and DEVICE_BYTES, made on the host once."""
        key = (fs.name, mkfs_opts, device_bytes)
        if key not in self.fresh:
            g = self.guest(device_bytes)
            scratch = g._ensure_state().scratch
            n = len(self.fresh)
            image, prefix = os.path.join(scratch, f"fresh-{n}.img"), os.path.join(scratch, f"fresh-{n}.log")
            os.close(ownership.create_file(image, device_bytes))
            fs.make(image, mkfs_opts)
            image_prefix(image, prefix, MARK_MKFS, SECTOR_SIZE)
            self.fresh[key] = FreshFs(image, prefix)
        return self.fresh[key]

    def close(self) -> None:
        for g in self.guests.values():
            g.close()
        self.guests.clear()
        self.fresh.clear()

    def __enter__(self) -> "LiveVm":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """Where a worker's guest time went: boots (one, plus one after each guest lost to a
        kernel death or hang: `lost`), seconds per job kind, and where its crash states'
        time went (state_profile: seconds summed over its workloads' recovery engines)."""
        boots = [b for g in self.guests.values() for b in g.boots]
        jobs: dict[str, float] = {}
        for g in self.guests.values():
            for k, v in g.jobs.items():
                jobs[k] = round(jobs.get(k, 0.0) + v, 3)
        return {"boots": len(boots), "lost": sum(g.lost for g in self.guests.values()),
                "boot_seconds": round(sum(boots), 2), "job_seconds": jobs,
                "state_profile": dict(self.state_profile)}


class VmBackend:
    """One run's guest: LIVE's (a kept guest), or one it boots for itself from KERNEL (checked,
    as FAULT, by VmEngine.parse)."""

    def __init__(self, fs: FsType, workload: WorkloadRunner, kernel: str | None,
                 kernel_modules: str | None, fault: str | None, live: LiveVm | None = None) -> None:
        self.fault = fault
        self.workload = workload
        self.fs = fs
        self.command = workload.guest_command(GUEST_PATHS)
        self.live = live
        if live is not None:
            self.kernel, self.base_initrd = live.kernel, live.base_initrd
        else:
            assert kernel is not None, "a VmBackend without a live guest is opened with the engine's kernel"
            packages.ensure(packages.vm_host_packages(), "--backend vm")
            self.kernel = vmkernel.resolve(kernel, kernel_modules)
            self.base_initrd = initramfs.build(self.kernel, fs)
        self.guest: Guest | LiveGuest | None = None
        self._engines = 0   # recovery engines made (one per recovery mode)
        self._recoveries: list[VmRecovery] = []
        self.coverage = coverage.RunCoverage(coverage.modules(fs), coverage.left_out(fs)) if coverage.enabled() else None
        self.mkfs = shlex.join([initramfs.which(fs.mkfs[0]), *fs.mkfs[1:]])

    def _guest(self, state: RunState, out_dir: str) -> Guest:
        if self.guest is None:
            self.guest = Guest(self.kernel, self.base_initrd, state, out_dir)
        return self.guest

    def record(self, fs: FsType, mkfs_opts: str, mount_opts: str, workload: WorkloadRunner,
               state: RunState, out_dir: str, device_bytes: int, log_path: str) -> Recording:
        files, records_disk, extra_env = self._workload_inputs(state, out_dir)
        env = {"PC_FS": fs.name, "PC_MKFS": fs.guest_mkfs(self.mkfs, mkfs_opts), "PC_MOUNT_OPTS": mount_opts,
               "PC_WORKLOAD": self.command, "PC_MARK_MKFS": MARK_MKFS, "PC_MARK_MOUNTED": MARK_MOUNTED,
               "PC_MARK_END": MARK_WORKLOAD_END, **extra_env, **coverage.guest_env(fs)}
        output = os.path.join(out_dir, "workload.out")
        prefix = None
        if self.live is not None:
            fresh = self.live.fresh_fs(fs, mkfs_opts, device_bytes)
            guest = self.guest = self.live.guest(device_bytes)
            guest._ensure_state()
            assert guest.disks is not None
            data, guest_log, records_disk = guest.disks.data, guest.disks.log, guest.disks.records
            _refill(data, fresh.image, device_bytes)
            _refill(guest_log, None, log_disk_bytes(device_bytes))
            env["PC_MKFS"], prefix = "", fresh.prefix
            outcome = guest.run_job("record", env, files=files, output=output)
        else:
            data, guest_log = os.path.join(state.scratch, "device.img"), log_path
            for path, size in ((data, device_bytes), (log_path, log_disk_bytes(device_bytes))):
                os.close(ownership.create_file(path, size))
            disks = [Disk(data, discard=True), Disk(log_path)] + ([Disk(records_disk)] if records_disk else [])
            outcome = self._guest(state, out_dir).boot("record", env, disks, timeout=BOOT_TIMEOUT_S,
                                                       files=files, output=output)
        if self.coverage is not None:
            self.coverage.add_lines(outcome.lines)
        if not outcome.completed:
            event = outcome.kernel_event("workload")
            assert event is not None
            raise KernelFailure(event)
        if prefix is None and self.fault != "drop-flush":
            finish_log(log_path)
        else:
            log_end(guest_log)  # the kernel closed it
            if guest_log == log_path:  # one-job boot: the guest wrote the run's log file itself
                guest_log = log_path + ".kernel"
                os.replace(log_path, guest_log)
            splice(prefix, guest_log, log_path, drop_flush=self.fault == "drop-flush")
            if guest_log != log_path and self.live is None:
                os.unlink(guest_log)
        check_log_rebuilds_disk(log_path, data, state.scratch)
        return self._recording(outcome, out_dir, output, records_disk, log_path, device_bytes, data)

    def _recording(self, outcome: Outcome, out_dir: str, output: str, records_disk: str | None,
                   log_path: str, device_bytes: int, data: str) -> Recording:
        words = dict(line.split(" ", 1) for line in outcome.lines
                     if " " in line and not line.startswith(("sysctl ", "cov ", "cov-error ")))
        code = int(words["workload-exit"])
        sysctls = dict(line.split(" ", 2)[1:] for line in outcome.lines if line.startswith("sysctl "))
        info = self.workload.result(code, output, sysctls, shlex.split(self.command))
        if self.workload.compiled is not None:  # the executor's records, off the records disk
            assert records_disk is not None
            self._fetch_records(records_disk, int(words.get("records", "-1")), out_dir)
        event = outcome.kernel_event("workload")
        findings = [kernel_finding(event)] if event else []
        plant = coverage.planted(self.coverage) if self.fault == "coverage-plant" and self.coverage else None
        if plant is not None:
            findings.append(kernel_finding(plant))
        return Recording(log_path, device_bytes, SECTOR_SIZE, info, final_image=data, kernel=outcome.kernel,
                         findings=findings)

    def _workload_inputs(self, state: RunState, out_dir: str) -> tuple[dict[str, bytes], str | None, dict[str, str]]:
        """Files under /pc, the records disk (one-job boots) and job variables the workload needs in the guest."""
        files = self.workload.guest_inputs(out_dir)
        if self.workload.compiled is None:
            return files, None, {}
        records = None
        if self.live is None:
            records = os.path.join(state.scratch, "records-disk.img")
            os.close(ownership.create_file(records, RECORDS_DISK_BYTES))
        return files, records, {"PC_RECORDS": GUEST_RECORDS, "PC_SYSCTLS": " ".join(SYSCTLS)}

    @staticmethod
    def _fetch_records(disk: str, size: int, out_dir: str) -> None:
        """The executor's records, copied off the guest's records disk to OUT/records.bin."""
        if size < 0:
            raise EnvError("the guest reported no records file: pc-exec wrote none")
        with open(disk, "rb") as src, os.fdopen(ownership.create_file(os.path.join(out_dir, RECORDS_FILE)), "wb") as dst:
            dst.write(src.read(size))  # a few bytes per op: small

    def recovery(self, fs: FsType, mount_opts: str, state: RunState,
                 inspect: PointInspect | None = None) -> VmRecovery:
        if self.guest is None:  # recheck: recovery only, in one-job boots
            self.guest = self._guest(state, state.scratch)
        fault = self.fault if self.fault in RECOVERY_FAULTS else None
        # One engine per recovery mode (--recovery both): each has its own batch disk and files.
        self._engines += 1
        engine = VmRecovery(self.guest, fs, mount_opts, state, timeout=BOOT_TIMEOUT_S, inspect=inspect, fault=fault,
                            engine=self._engines - 1, guest_reads=guest_reads(fs), coverage=self.coverage,
                            profile_sink=self.live.state_profile if self.live else None)
        self._recoveries.append(engine)
        return engine

    def recovery_recorder(self, fs: FsType, state: RunState, device_bytes: int) -> None:
        raise UsageError("--recovery-crash records recovery mounts on the fuse recorder, not in the vm guest")

    def report_extra(self) -> dict[str, Any]:
        guest = self.guest
        vm: dict[str, Any] = {"kernel_spec": self.kernel.label, "accel": guest.accel if guest else None,
                              "boot_seconds": guest.boots if guest else [], "live_guest": self.live is not None,
                              "kernel_modules": self.kernel.modules if not self.kernel.label.startswith("debian:") else None,
                              "fault": self.fault}
        if self.workload.compiled is not None:
            vm["content_checks"] = CONTENT_CHECKS_IN_GUEST if guest_reads(self.fs) else CONTENT_CHECKS
        if self._recoveries:   # where this run's guest crash states' time went
            total: dict[str, float] = {}
            for r in self._recoveries:
                for k, v in r.profile.items():
                    total[k] = total.get(k, 0.0) + v
            vm["state_profile"] = state_profile(total)
        return {"vm": vm, **({"coverage": self.coverage.report()} if self.coverage is not None else {})}


def check_log_rebuilds_disk(log_path: str, disk: str, scratch_dir: str) -> None:
    """The recording's log, replayed onto a zeroed device, must be the guest's data disk byte
    for byte. A live guest keeps its disks and its kernel from case to case: this check is what
    shows that a finding comes from what the kernel wrote in this recording, not from state an
    earlier case left on the disk or from writes the log missed."""
    with LogReader(log_path) as reader:
        at = log_differs_from(reader, disk, os.path.join(scratch_dir, "log-check.img"))
    if at is not None:
        raise EnvError(f"the recorded log does not rebuild the guest's data disk (they differ in the 64 KiB "
                       f"at byte {at}): the recording cannot be trusted (writes racing to the same blocks, "
                       f"e.g. O_DIRECT from several threads, can reach the disk in another order than the log's)")


def _refill(path: str, image: str | None, size: int) -> None:
    """Make the guest disk PATH (open in QEMU) a copy of IMAGE, or zeros: same file, new content."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, 0)
        os.ftruncate(fd, size)
        if image is not None:
            with open(image, "rb") as src:
                copy_range(src.fileno(), fd, 0, size, 0)
    finally:
        os.close(fd)
