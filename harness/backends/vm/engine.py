"""The `vm` engine: the kernel under test's own dm-log-writes, in a QEMU guest (backend.py).

It is not a host-side RecordedDevice engine: the recorded device, mkfs, the
marks and the workload all live in the guest (docs/architecture.md, "Backends").
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from foundation.errors import UsageError
from foundation.filesystems import FsType
from harness.backends.engine import Backend, BackendConfig, Engine, Option, configure, register_engine
from harness.backends.session import FAULT
from harness.backends.vm.backend import LiveVm, VmBackend, prepare_host
from workloads.runner import WorkloadRunner

NEEDS_KERNEL = "--backend vm needs --kernel debian:PACKAGE (e.g. debian:linux-image-6.12-amd64) or --kernel PATH"
_NEEDS_VM = "--kernel and --kernel-modules need --backend vm"
# Test faults of the vm backend: drop-flush leaves the kernel's flushes out of
# its log (as the fuse recorder's fault does); recovery-panic crashes the
# guest kernel (sysrq) at the first recovery mount of every batch;
# recovery-hang suspends that mount's device-mapper device first, so the
# mount waits on I/O that never completes (the live guest's hang watchdog);
# coverage-plant plants a violation only coverage-rich paths reach: a `kernel` finding
# for every workload whose path ran at least POWERCUT_VM_PLANT_FUNCTIONS functions of the
# file system's modules (harness/backends/vm/coverage.py; the coverage engine's test).
FAULTS = ("drop-flush", "recovery-panic", "recovery-hang", "coverage-plant")


@dataclass(frozen=True)
class VmOptions:
    kernel: str                         # debian:PACKAGE or a kernel image path
    kernel_modules: str | None = None   # with a kernel image: its lib/modules/VERSION
    fault: str | None = None


class VmEngine(Engine):
    name = "vm"
    summary = "the kernel under test (--kernel) in a QEMU guest with its own dm-log-writes"
    options = (Option("kernel", "--kernel", metavar="debian:PACKAGE|PATH", needs=_NEEDS_VM,
                      help="--backend vm: the kernel under test, a Debian kernel package "
                           "(e.g. debian:linux-image-6.12-amd64) or a vmlinux/bzImage file"),
               Option("kernel_modules", "--kernel-modules", metavar="DIR", needs=_NEEDS_VM,
                      help="--backend vm with --kernel PATH: its lib/modules/VERSION directory (with modules.dep)"),
               FAULT)
    faults = FAULTS
    keeps_guest = True
    logs_writes_at_flush = True  # the guest's dm-log-writes

    def parse(self, values: Mapping[str, Any]) -> VmOptions:
        if not values["kernel"]:
            raise UsageError(NEEDS_KERNEL)
        fault = values["fault"]
        if fault and fault not in FAULTS:
            raise UsageError(f"--fault {fault}: the vm backend knows {', '.join(FAULTS)}")
        return VmOptions(values["kernel"], values["kernel_modules"], fault)

    def prepare(self, opts: VmOptions) -> None:
        prepare_host(opts.kernel, opts.kernel_modules)

    def open(self, fs: FsType, workload: WorkloadRunner, opts: VmOptions) -> Backend:
        return VmBackend(fs, workload, opts.kernel, opts.kernel_modules, opts.fault)

    def command_args(self, opts: VmOptions) -> list[str]:
        # The same kernel, in a guest (recheck boots it too).
        return (super().command_args(opts) + ["--backend", "vm", "--kernel", opts.kernel]
                + (["--kernel-modules", opts.kernel_modules] if opts.kernel_modules else []))

    def describe(self, opts: VmOptions) -> dict[str, Any]:
        return {"kernel_spec": opts.kernel}

    def live_guest(self, opts: VmOptions, fss: list[FsType]) -> AbstractContextManager[LiveVm | None]:
        return LiveVm(opts.kernel, opts.kernel_modules, fss, opts.fault)

    def recheck_config(self, saved: Mapping[str, Any]) -> BackendConfig:
        """Recovery by the kernel the run was recorded on, in a guest (runs from before the vm
        section was saved: the host kernel)."""
        vm = saved.get("vm")
        if not vm:
            return super().recheck_config(saved)
        return configure("vm", {"kernel": vm["kernel_spec"], "kernel_modules": vm.get("kernel_modules"),
                                "fault": vm.get("fault")})


register_engine(VmEngine())
