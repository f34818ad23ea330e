"""Run a shell export in the vm backend's guest: does it reproduce on that kernel?

The guest (harness/backends/vm: the kernel under test in QEMU, busybox,
dmsetup, mkfs, the kernel's own dm-log-writes) gets the exported script,
pc-repro built statically on the host (the guest has no compiler) and the
file system's fsck, and three empty disks: data, log and replay target. The
script runs exactly as a kernel developer would run it, with DATA_DEV,
LOG_DEV, REPLAY_DEV and PC_REPRO pointing at those. Its output and exit
status come back over the guest's serial ports.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from harness.backends.vm import initramfs, packages
from harness.backends.vm import kernel as vmkernel
from harness.backends.vm.qemu import Disk, Guest
from harness.foundation import ownership
from harness.foundation.errors import EnvError
from harness.foundation.filesystems import get_fs
from harness.foundation.runstate import RunState
from harness.reports.export.finding import ExportInput
from harness.reports.export.shell import C_SOURCE

BOOT_TIMEOUT_S = 900
JOB = """say "export check"
mkdir -p /pc/bin && cp /pc/fsck /pc/bin/{fsck} && chmod 755 /pc/bin/{fsck} /pc/pc-repro
DATA_DEV=/dev/vda LOG_DEV=/dev/vdb REPLAY_DEV=/dev/vdc PC_REPRO=/pc/pc-repro WORK=/tmp/repro \\
    PATH=/pc/bin:$PATH sh /pc/repro.sh > /dev/ttyS1 2>&1
result "exit $?"
"""


@dataclass
class VmCheck:
    kernel: str          # the guest's uname -r
    exit_code: int       # the script's: 1 reproduced, 0 clean, 2 could not run
    output: str


def _static_repro(out: str) -> None:
    p = subprocess.run(["cc", "-O2", "-static", "-o", out, C_SOURCE], capture_output=True, text=True)
    if p.returncode != 0:
        raise EnvError(f"building pc-repro statically for the guest failed: {p.stderr.strip().splitlines()[:1]}")


def check_in_vm(x: ExportInput, script: str, kernel_spec: str) -> VmCheck:
    """Boot KERNEL_SPEC (as --kernel takes it) and run SCRIPT (the shell export of X) there."""
    fs = get_fs(x.fs)
    packages.ensure(packages.VM_HOST_PACKAGES, "--check-vm")
    kernel = vmkernel.resolve(kernel_spec, None)
    base = initramfs.build(kernel, fs)
    fsck = initramfs.which(fs.fsck[0])
    state = RunState.create(f"export check of {x.name} on {kernel_spec}")
    try:
        repro = os.path.join(state.scratch, "pc-repro")
        _static_repro(repro)
        disks = []
        for name, size in (("data", x.device_bytes), ("log", max(64 << 20, 2 * x.device_bytes)),
                           ("replay", x.device_bytes)):
            path = os.path.join(state.scratch, f"{name}.img")
            os.close(ownership.create_file(path, size))
            disks.append(Disk(path))
        with open(repro, "rb") as f:
            repro_bytes = f.read()
        with open(fsck, "rb") as f:
            fsck_bytes = f.read()
        output = os.path.join(state.scratch, "output.txt")
        guest = Guest(kernel, base, state, state.scratch)
        outcome = guest.boot("export", {}, disks, timeout=BOOT_TIMEOUT_S, output=output,
                             files={"export.sh": JOB.format(fsck=os.path.basename(fsck)).encode(),
                                    "repro.sh": script.encode(), "pc-repro": repro_bytes, "fsck": fsck_bytes})
        with open(output, errors="replace") as f:
            text = f.read()
        codes = [ln.split()[1] for ln in outcome.lines if ln.startswith("exit ")]
        if not outcome.completed or not codes:
            raise EnvError(f"the guest did not finish the export check: {outcome.console_tail[-300:]}")
        return VmCheck(outcome.kernel, int(codes[-1]), text)
    finally:
        state.teardown_or_warn()
